package gormstore

import (
	"context"
	"database/sql"
	"fmt"
	"sync"
	"time"

	"gorm.io/gorm"
	"gorm.io/gorm/callbacks"
	"gorm.io/gorm/clause"
	"gorm.io/gorm/logger"
	"gorm.io/gorm/schema"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/store"
	"github.com/idemkit/idem/core/syncclock"
	"github.com/idemkit/idem/sqlstore"
)

// Store is a store.TxStore on GORM. It is a thin layer over sqlstore: the
// same SQL, the same table, run through GORM's connection pool, or through
// the transaction a *gorm.DB is bound to. Create it with New.
type Store struct {
	db    *gorm.DB
	inner *sqlstore.Store
}

var (
	_ store.Store        = (*Store)(nil)
	_ store.TxStore      = (*Store)(nil)
	_ store.Inspector    = (*Store)(nil)
	_ store.Settler      = (*Store)(nil)
	_ store.MultiPrimary = (*Store)(nil)
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

// WithRequireSyncWait makes Check fail on a MariaDB Galera node whose
// connections read without wsrep_sync_wait=1 (set it in the DSN); see
// sqlstore.WithRequireSyncWait.
func WithRequireSyncWait() Option { return sqlstore.WithRequireSyncWait() }

// WithOneWriterNode tells the store that every process writes through
// one node of its MariaDB Galera cluster, so that a completer runs
// finishers on atomic routes; see sqlstore.WithOneWriterNode.
func WithOneWriterNode() Option { return sqlstore.WithOneWriterNode() }

// New returns a store on db. It registers a callback on db (see Plugin):
// a GORM write whose context carries a transaction (DB(ctx)) but would run
// outside it fails with ErrOutsideTx instead of losing atomicity (Postgres,
// MySQL/MariaDB) or waiting for the transaction's lock (SQLite);
// db.Use(Plugin()) makes such writes join the transaction instead.
// The dialect follows db.Dialector.Name():
// "postgres" (gorm.io/driver/postgres), "mysql" (gorm.io/driver/mysql, for
// MySQL 8 and MariaDB 10.6+; open it with parseTime=true) or "sqlite"
// (github.com/glebarez/sqlite, or gorm.io/driver/sqlite). It does not create
// the table: call Migrate, or apply sqlstore.Schema / the files in
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
	if err := register(db); err != nil {
		return nil, fmt.Errorf("%w: gormstore: registering the transaction callback on db: %w", core.ErrConfig, err)
	}
	return &Store{db: db, inner: inner}, nil
}

// Migrate creates the table and its index if they do not exist. It runs
// sqlstore's DDL (sqlstore.Schema), not a GORM model migration, so the
// table is the same whichever store created it and a gormstore and a
// sqlstore can share it.
func (s *Store) Migrate(ctx context.Context) error { return s.inner.Migrate(s.ctx(ctx)) }

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
// Begin or WithTx). In middleware-managed atomic mode handlers call it with
// the request's context (c.Request.Context(), c.Request().Context(),
// r.Context()) and run their business writes on it. Begin defers BEGIN to
// the transaction's first statement (the claim, so a handler's transaction
// has begun); DB begins it if nothing has, and if that fails, the returned
// *gorm.DB carries the error.
//
// DB never returns nil. When ctx carries no transaction, the returned
// *gorm.DB carries an error (GORM's idiom: every statement on it fails with
// it, and .Error has it) wrapping core.ErrNoTx that names the fix: a
// framework's context was passed instead of the request's, or the code
// does not run in a protected request. In a Leased route it is the
// attempt's own transaction, which commits with the attempt's completion
// (docs/contract.md, section 5). Code that runs both inside and
// outside atomic mode uses TxFrom and falls back to its own *gorm.DB.
func DB(ctx context.Context) *gorm.DB {
	switch v := ctx.Value(txKey{}).(type) {
	case *gorm.DB:
		if inTransaction(v) {
			return v
		}
	case *deferred:
		// Through sqlstore even when the transaction has begun: the
		// store learns that the application has its connection (a
		// transaction it wrote in does not end off the caller's path).
		if _, err := sqlstore.ConnFrom(ctx); err != nil {
			tx := v.base.WithContext(ctx)
			_ = tx.AddError(err)
			return tx
		}
		if tx := v.get(); tx != nil {
			return tx
		}
	}
	return failed(ctx, noTx(ctx))
}

// TxFrom returns the *gorm.DB bound to the transaction ctx carries, or
// nil: for code that runs both inside and outside atomic mode and falls
// back to its own *gorm.DB. Handlers of atomic routes call DB, which fails
// loudly instead of returning nil.
func TxFrom(ctx context.Context) *gorm.DB {
	switch v := ctx.Value(txKey{}).(type) {
	case *gorm.DB:
		if inTransaction(v) {
			return v
		}
	case *deferred:
		if _, err := sqlstore.ConnFrom(ctx); err == nil { // as DB
			return v.get()
		}
	}
	return nil
}

// noTx is the error of DB given a context without a transaction.
func noTx(ctx context.Context) error {
	if info, ok := core.AttemptFrom(ctx); ok && !info.Atomic {
		return fmt.Errorf("%w: gormstore.DB: this Leased attempt has no transaction of its own (it could not begin one: see the log); use your own *gorm.DB", core.ErrNoTx)
	}
	return fmt.Errorf("%w: gormstore.DB needs the request's context of a route in atomic mode: c.Request.Context() (Gin), c.Request().Context() (Echo), r.Context() (net/http, chi); "+
		"code that holds its own transaction passes it with gormstore.WithTx", core.ErrNoTx)
}

// failed returns a *gorm.DB on no database that carries err: every
// statement run on it fails with err, none reaches a database.
func failed(ctx context.Context, err error) *gorm.DB {
	db, oerr := gorm.Open(noDatabase{}, &gorm.Config{Logger: logger.Discard, DisableAutomaticPing: true, SkipDefaultTransaction: true})
	if oerr != nil { // cannot happen: noDatabase.Initialize does not fail
		panic(oerr)
	}
	db = db.WithContext(ctx)
	_ = db.AddError(err)
	return db
}

// noDatabase is the dialector of the *gorm.DB that DB returns when ctx
// carries no transaction: it has no connection, and the error the
// *gorm.DB carries stops every statement before one would be needed.
type noDatabase struct{}

func (noDatabase) Name() string { return "idem-no-transaction" }
func (noDatabase) Initialize(db *gorm.DB) error {
	callbacks.RegisterDefaultCallbacks(db, &callbacks.Config{})
	return nil
}
func (noDatabase) Migrator(*gorm.DB) gorm.Migrator                     { return nil }
func (noDatabase) DataTypeOf(*schema.Field) string                     { return "" }
func (noDatabase) DefaultValueOf(*schema.Field) clause.Expression      { return clause.Expr{SQL: "DEFAULT"} }
func (noDatabase) BindVarTo(w clause.Writer, _ *gorm.Statement, _ any) { _ = w.WriteByte('?') }
func (noDatabase) QuoteTo(w clause.Writer, s string)                   { _, _ = w.WriteString(s) }
func (noDatabase) Explain(sql string, _ ...any) string                 { return sql }

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
// InTx reports false (store.TxStore).
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
func (s *Store) Begin(ctx context.Context) (context.Context, store.Tx, error) {
	d := &deferred{base: s.db}
	callerCtx := ctx
	ctx, tx, err := s.inner.BeginWith(ctx, func(ctx context.Context) (sqlstore.Conn, store.Tx, error) {
		g := s.db.WithContext(ctx)
		var pinned *sql.Conn
		if s.inner.Dialect() == sqlstore.SQLite {
			// As sqlstore does on SQLite: the transaction gets a connection
			// of its own, so that a COMMIT SQLite refuses (a deferred
			// foreign key), which leaves the transaction open, is rolled
			// back on it before the connection goes back to the pool.
			sqlDB, err := s.db.DB()
			if err != nil {
				return nil, nil, err
			}
			if pinned, err = sqlDB.Conn(ctx); err != nil {
				return nil, nil, err
			}
			g = s.db.Session(&gorm.Session{Context: ctx}) // a statement of its own
			g.Statement.ConnPool = pinned
		}
		tx := g.Begin(s.inner.TxOptions())
		for try := 1; tx.Error != nil && pinned == nil && ctx.Err() == nil && try < maxBeginTries; try++ {
			// BEGIN commits nothing: sent again on another connection when
			// it met a pooled connection the server closed (sqlstore's
			// beginTx says why database/sql does not).
			tx = g.Begin(s.inner.TxOptions())
		}
		if tx.Error != nil {
			if pinned != nil {
				_ = pinned.Close()
			}
			return nil, nil, tx.Error
		}
		// The transaction is bound to sqlstore's context of its own (so
		// that a replay's ROLLBACK can run after the answer); the
		// application's statements run with the context given to Begin,
		// as they did before, so their errors at its deadline and its
		// cause are that context's.
		d.set(tx.WithContext(callerCtx))
		return tx.Statement.ConnPool, gormTx{tx: tx, d: d, pinned: pinned}, nil
	})
	if err != nil {
		return ctx, nil, err
	}
	return context.WithValue(ctx, txKey{}, d), tx, nil
}

// maxBeginTries bounds how often Begin sends BEGIN (see sqlstore's
// beginTx).
const maxBeginTries = 16

// deferred is the GORM transaction of a context from Begin, once begun.
type deferred struct {
	base  *gorm.DB
	mu    sync.Mutex
	tx    *gorm.DB
	ended bool // committed or rolled back (by the engine)
}

func (d *deferred) end() {
	d.mu.Lock()
	d.ended = true
	d.mu.Unlock()
}

// liveTx is TxFrom without a transaction of Begin that has ended: the
// transaction statements of the application's *gorm.DB (see Plugin) may
// join, or must not run beside. Work a handler leaves for after its
// response (a context from context.WithoutCancel) runs as without idem.
func liveTx(ctx context.Context) *gorm.DB {
	if d, ok := ctx.Value(txKey{}).(*deferred); ok {
		d.mu.Lock()
		ended := d.ended
		d.mu.Unlock()
		if ended {
			return nil
		}
	}
	return TxFrom(ctx)
}

// set records the transaction Begin's BEGIN began. sqlstore may roll back
// a transaction in which only the claim ran and begin it again (a claim of
// an expired record on MariaDB, a serialization failure on Postgres, a
// deadlock victim): that Rollback ended the first (gormTx.Rollback), and
// the new one is live.
func (d *deferred) set(tx *gorm.DB) {
	d.mu.Lock()
	d.tx, d.ended = tx, false
	d.mu.Unlock()
}

func (d *deferred) get() *gorm.DB {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.tx
}

type gormTx struct {
	tx     *gorm.DB
	d      *deferred
	pinned *sql.Conn // SQLite: the transaction's own connection
}

func (t gormTx) Commit() error {
	defer t.d.end()
	err := t.tx.Commit().Error
	t.unpin(err)
	return err
}

func (t gormTx) Rollback() error {
	defer t.d.end()
	err := t.tx.Rollback().Error
	t.unpin(err)
	return err
}

// unpin gives a pinned connection back, after a ROLLBACK on it when the
// transaction's end failed (a refused COMMIT leaves it open).
func (t gormTx) unpin(err error) {
	if t.pinned == nil {
		return
	}
	if err != nil {
		_, _ = t.pinned.ExecContext(context.Background(), "ROLLBACK")
	}
	_ = t.pinned.Close()
}

// ctx hands the GORM transaction of WithTx, if ctx carries one, to
// sqlstore as the connection to run on. (Begin's context already carries
// sqlstore's transaction.)
func (s *Store) ctx(ctx context.Context) context.Context {
	if tx, ok := ctx.Value(txKey{}).(*gorm.DB); ok && inTransaction(tx) {
		return sqlstore.WithConn(ctx, tx.Statement.ConnPool)
	}
	return ctx
}

// --- store.Store: sqlstore's, in the GORM transaction of ctx -------------------

// Claim implements store.Store; see sqlstore.Store.Claim.
func (s *Store) Claim(ctx context.Context, req store.ClaimRequest) (store.ClaimResult, error) {
	return s.inner.Claim(s.ctx(ctx), req)
}

// Extend implements store.Store.
func (s *Store) Extend(ctx context.Context, id store.ID, token int64, leaseUntil time.Time) error {
	return s.inner.Extend(s.ctx(ctx), id, token, leaseUntil)
}

// Complete implements store.Store.
func (s *Store) Complete(ctx context.Context, id store.ID, token int64, c store.Completion) error {
	return s.inner.Complete(s.ctx(ctx), id, token, c)
}

// Release implements store.Store.
func (s *Store) Release(ctx context.Context, id store.ID, token int64) error {
	return s.inner.Release(s.ctx(ctx), id, token)
}

// Get implements store.Store.
func (s *Store) Get(ctx context.Context, id store.ID, now time.Time) (store.Record, error) {
	return s.inner.Get(s.ctx(ctx), id, now)
}

// Mark implements store.Settler; see sqlstore.Store.Mark.
func (s *Store) Mark(ctx context.Context, id store.ID, token int64, m store.Mark) error {
	return s.inner.Mark(s.ctx(ctx), id, token, m)
}

// Due implements store.Settler; see sqlstore.Store.Due.
func (s *Store) Due(ctx context.Context, now time.Time, limit int) ([]store.Pending, error) {
	return s.inner.Due(s.ctx(ctx), now, limit)
}

// Visit implements store.Settler; see sqlstore.Store.Visit.
func (s *Store) Visit(ctx context.Context, id store.ID, token int64, seen, next time.Time, tries int) (bool, error) {
	return s.inner.Visit(s.ctx(ctx), id, token, seen, next, tries)
}

// MultiPrimary implements store.MultiPrimary; see
// sqlstore.Store.MultiPrimary.
func (s *Store) MultiPrimary(ctx context.Context) (bool, error) {
	return s.inner.MultiPrimary(s.ctx(ctx))
}

// Embedded implements store.Embedded; see sqlstore.Store.Embedded.
func (s *Store) Embedded() bool { return s.inner.Embedded() }

// List implements store.Inspector; see sqlstore.Store.List.
func (s *Store) List(ctx context.Context, q store.ListQuery) ([]store.Record, error) {
	return s.inner.List(s.ctx(ctx), q)
}

// DeleteExpired implements store.Store; see sqlstore.Store.DeleteExpired.
func (s *Store) DeleteExpired(ctx context.Context, now time.Time, limit int) (int, error) {
	return s.inner.DeleteExpired(s.ctx(ctx), now, limit)
}

// Now reads the database's clock (syncclock.TimeSource); see sqlstore.Store.Now.
func (s *Store) Now(ctx context.Context) (time.Time, error) { return s.inner.Now(s.ctx(ctx)) }

var _ syncclock.TimeSource = (*Store)(nil)

// Check verifies, at start-up, that the table exists with the columns and
// the primary key the store needs, and that the server is one the GORM
// dialector's SQL runs on (see sqlstore.Store.Check). A misconfiguration is
// an error wrapping core.ErrConfig whose text names the fix ("run
// store.Migrate"); an unreachable server wraps core.ErrStoreUnavailable.
func (s *Store) Check(ctx context.Context) error { return s.inner.Check(s.ctx(ctx)) }
