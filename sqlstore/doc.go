// Package sqlstore is an idempotency store on database/sql that joins the
// application's transaction (atomic mode) on Postgres, MySQL/MariaDB and
// SQLite. It implements store.TxStore; gormstore runs its statements
// through GORM. Its MySQL/MariaDB and SQLite statements are its own; the
// Postgres ones are internal/pgsql's, which pgxstore runs too (one table,
// one SQL family), and those of the completer's marks and the operator's
// listing are internal/storeutil's, shared by both SQL stores.
//
// Middleware-managed atomic mode: the engine calls Begin, and the handler
// writes through Tx(r.Context()). Caller-managed: code that holds a
// *sql.Tx passes WithTx(ctx, tx) to the engine (Engine.Once) or the store.
// Outside a transaction the store runs in leased mode.
//
// The table is created by Migrate, or by the DDL of Schema, shipped as
// migrations/<dialect>/0001_idempotency_records.{up,down}.sql. The README
// lists the statements of each dialect, how each one detects a duplicate
// while the first request's transaction is still open (SQLite waits for it
// instead), the isolation levels it expects and its statement counts.
package sqlstore
