// Package gormstore is an idempotency store on GORM that joins the
// application's transaction (atomic mode) on Postgres, MySQL/MariaDB and
// SQLite.
//
// It is a thin layer over [github.com/idemkit/idem/sqlstore]: the same SQL
// and the same table, run through GORM's connection pool or the GORM
// transaction in the context. Middleware-managed atomic mode: the engine
// calls Begin and the handler writes through DB(r.Context()).
// Caller-managed: code inside db.Transaction(func(tx *gorm.DB) error {...})
// passes WithTx(ctx, tx) to the engine (Engine.Once) or to the store.
//
// Repositories that write through the application's own *gorm.DB
// (r.db.WithContext(ctx).Create(...)) join that transaction with the
// plugin: db.Use(Plugin()). Without it, such a write fails with
// ErrOutsideTx instead of running outside the transaction.
package gormstore
