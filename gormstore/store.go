package gormstore

import (
	"context"
	"database/sql"
	"fmt"
	"sync"
	"time"

	"gorm.io/gorm"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/sqlstore"
)

// Store is a core.TxStore on GORM. It is a thin layer over sqlstore: the
// same SQL, the same table, run through GORM's connection pool, or through
// the transaction a *gorm.DB is bound to. Create it with New.
type Store struct {
	db    *gorm.DB
	inner *sqlstore.Store
}

var (
	_ core.Store   = (*Store)(nil)
	_ core.TxStore = (*Store)(nil)
)

// Option configures New. gormstore takes sqlstore's options.
type Option = sqlstore.Option

// WithTable sets the table name (default "idempotency_records"); see
// sqlstore.WithTable for the rules.
func WithTable(name string) Option { return sqlstore.WithTable(name) }

// WithTxOptions sets the options Begin starts transactions with (default:
// READ COMMITTED on MySQL/MariaDB, the database's default elsewhere); see
// sqlstore.WithTxOptions.
func WithTxOptions(opts *sql.TxOptions) Option { return sqlstore.WithTxOptions(opts) }

// New returns a store on db. The dialect follows db.Dialector.Name():
// "postgres" (gorm.io/driver/postgres), "mysql" (gorm.io/driver/mysql, for
// MySQL 8 and MariaDB 10.6+; open it with parseTime=true) or "sqlite"
// (github.com/glebarez/sqlite, or gorm.io/driver/sqlite). It does not create
// the table: call AutoMigrate, or apply sqlstore.Schema / the files in
// sqlstore/migrations with your migration tool.
func New(db *gorm.DB, opts ...Option) (*Store, error) {
	if db == nil || db.Dialector == nil {
		return nil, fmt.Errorf("%w: gormstore: nil *gorm.DB", core.ErrConfig)
	}
	var d sqlstore.Dialect
	switch name := db.Dialector.Name(); name {
	case "postgres":
		d = sqlstore.Postgres
	case "mysql":
		d = sqlstore.MySQL
	case "sqlite", "sqlite3":
		d = sqlstore.SQLite
	default:
		return nil, fmt.Errorf("%w: gormstore: unsupported GORM dialector %q (want postgres, mysql or sqlite)", core.ErrConfig, name)
	}
	sqlDB, err := db.DB()
	if err != nil {
		return nil, fmt.Errorf("%w: gormstore: %w", core.ErrConfig, err)
	}
	inner, err := sqlstore.New(sqlDB, d, opts...)
	if err != nil {
		return nil, err
	}
	return &Store{db: db, inner: inner}, nil
}

// AutoMigrate creates the table and its index if they do not exist. It runs
// sqlstore's DDL (sqlstore.Schema), not a GORM model migration, so the
// table is the same whichever store created it and a gormstore and a
// sqlstore can share it.
func (s *Store) AutoMigrate(ctx context.Context) error { return s.inner.Migrate(s.ctx(ctx)) }

// Table reports the store's table name.
func (s *Store) Table() string { return s.inner.Table() }

// --- transactions ------------------------------------------------------------

type txKey struct{}

// WithTx returns a context carrying tx, a *gorm.DB bound to the
// application's own transaction (caller-managed atomic mode), such as the
// tx of db.Transaction(func(tx *gorm.DB) error {...}). Store methods called
// with the context run in that transaction; the engine sees InTx and never
// commits or rolls back. A tx that is not in a transaction is ignored.
func WithTx(ctx context.Context, tx *gorm.DB) context.Context {
	return context.WithValue(ctx, txKey{}, tx)
}

// DB returns the *gorm.DB bound to the transaction ctx carries (set by
// Begin or WithTx), or nil. In middleware-managed atomic mode handlers call
// it with the request's context (c.Request.Context(),
// c.Request().Context(), r.Context()) and run their business writes on it.
// Begin defers BEGIN to the transaction's first statement (the claim, so a
// handler's transaction has begun); DB begins it if nothing has, and if
// that fails, the returned *gorm.DB carries the error.
func DB(ctx context.Context) *gorm.DB {
	switch v := ctx.Value(txKey{}).(type) {
	case *gorm.DB:
		if inTransaction(v) {
			return v
		}
	case *deferred:
		if tx := v.get(); tx != nil {
			return tx
		}
		if _, err := sqlstore.ConnFrom(ctx); err != nil {
			tx := v.base.WithContext(ctx)
			_ = tx.AddError(err)
			return tx
		}
		return v.get()
	}
	return nil
}

func inTransaction(tx *gorm.DB) bool {
	if tx == nil || tx.Statement == nil {
		return false
	}
	_, ok := tx.Statement.ConnPool.(gorm.TxCommitter)
	return ok
}

// InTx reports whether ctx carries a GORM transaction (Begin, WithTx).
func (s *Store) InTx(ctx context.Context) bool {
	switch v := ctx.Value(txKey{}).(type) {
	case *gorm.DB:
		return inTransaction(v)
	case *deferred:
		return true
	}
	return false
}

// WithoutTx returns ctx with the transaction it carries (Begin, WithTx)
// hidden: store methods called with it run outside any transaction, and
// InTx reports false (core.TxStore).
func (s *Store) WithoutTx(ctx context.Context) context.Context {
	if ctx.Value(txKey{}) != nil {
		// A GORM transaction of WithTx becomes sqlstore's connection first,
		// so that sqlstore knows a transaction was hidden (see
		// sqlstore.Store.WithoutTx: SQLite refuses a leased claim beside it).
		ctx = context.WithValue(s.ctx(ctx), txKey{}, nil)
	}
	return s.inner.WithoutTx(ctx)
}

// Begin starts a transaction with db.WithContext(ctx).Begin and returns a
// context carrying the *gorm.DB bound to it (see DB). The transaction is
// bound to ctx: cancelling ctx rolls it back. The GORM transaction begins
// at its first statement, the claim, as sqlstore's Begin does: a duplicate
// of a request this process is running answers in progress without a
// connection (see sqlstore.Store.Begin and sqlstore's README).
func (s *Store) Begin(ctx context.Context) (context.Context, core.Tx, error) {
	d := &deferred{base: s.db}
	ctx, tx, err := s.inner.BeginWith(ctx, func(ctx context.Context) (sqlstore.Conn, core.Tx, error) {
		tx := s.db.WithContext(ctx).Begin(s.inner.TxOptions())
		if tx.Error != nil {
			return nil, nil, tx.Error
		}
		d.set(tx)
		return tx.Statement.ConnPool, gormTx{tx}, nil
	})
	if err != nil {
		return ctx, nil, err
	}
	return context.WithValue(ctx, txKey{}, d), tx, nil
}

// deferred is the GORM transaction of a context from Begin, once begun.
type deferred struct {
	base *gorm.DB
	mu   sync.Mutex
	tx   *gorm.DB
}

func (d *deferred) set(tx *gorm.DB) {
	d.mu.Lock()
	d.tx = tx
	d.mu.Unlock()
}

func (d *deferred) get() *gorm.DB {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.tx
}

type gormTx struct{ tx *gorm.DB }

func (t gormTx) Commit() error   { return t.tx.Commit().Error }
func (t gormTx) Rollback() error { return t.tx.Rollback().Error }

// ctx hands the GORM transaction of WithTx, if ctx carries one, to
// sqlstore as the connection to run on. (Begin's context already carries
// sqlstore's transaction.)
func (s *Store) ctx(ctx context.Context) context.Context {
	if tx, ok := ctx.Value(txKey{}).(*gorm.DB); ok && inTransaction(tx) {
		return sqlstore.WithConn(ctx, tx.Statement.ConnPool)
	}
	return ctx
}

// --- core.Store: sqlstore's, in the GORM transaction of ctx -------------------

// Claim implements core.Store; see sqlstore.Store.Claim.
func (s *Store) Claim(ctx context.Context, req core.ClaimRequest) (core.ClaimResult, error) {
	return s.inner.Claim(s.ctx(ctx), req)
}

// Extend implements core.Store.
func (s *Store) Extend(ctx context.Context, id core.ID, token int64, leaseUntil time.Time) error {
	return s.inner.Extend(s.ctx(ctx), id, token, leaseUntil)
}

// Complete implements core.Store.
func (s *Store) Complete(ctx context.Context, id core.ID, token int64, c core.Completion) error {
	return s.inner.Complete(s.ctx(ctx), id, token, c)
}

// Release implements core.Store.
func (s *Store) Release(ctx context.Context, id core.ID, token int64) error {
	return s.inner.Release(s.ctx(ctx), id, token)
}

// Get implements core.Store.
func (s *Store) Get(ctx context.Context, id core.ID, now time.Time) (core.Record, error) {
	return s.inner.Get(s.ctx(ctx), id, now)
}

// DeleteExpired implements core.Store; see sqlstore.Store.DeleteExpired.
func (s *Store) DeleteExpired(ctx context.Context, now time.Time, limit int) (int, error) {
	return s.inner.DeleteExpired(s.ctx(ctx), now, limit)
}

// Now reads the database's clock (core.TimeSource); see sqlstore.Store.Now.
func (s *Store) Now(ctx context.Context) (time.Time, error) { return s.inner.Now(s.ctx(ctx)) }

var _ core.TimeSource = (*Store)(nil)
