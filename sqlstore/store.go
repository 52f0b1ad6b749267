package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/store"
	"github.com/idemkit/idem/internal/debugtext"
	"github.com/idemkit/idem/internal/inflight"
	"github.com/idemkit/idem/internal/pgsql"
	"github.com/idemkit/idem/internal/storeutil"
	"github.com/idemkit/idem/sqlstore/internal/testhook"
)

// DefaultTable is the table name used when WithTable is not given.
const DefaultTable = "idempotency_records"

// Conn is what the store runs its statements on. *sql.DB, *sql.Tx, *sql.Conn
// and gorm.ConnPool all satisfy it.
type Conn interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// Store is a store.TxStore on database/sql. Create it with New.
type Store struct {
	db     *sql.DB
	d      Dialect
	table  string
	txOpts *sql.TxOptions
	// syncWait: Check requires wsrep_sync_wait on a Galera node
	// (WithRequireSyncWait).
	syncWait bool
	q        queries
	mq       storeutil.MarkStatements // store.Settler's (settle.go)
	lock     uint64                   // mixed into Postgres advisory lock keys (per table)
	reg      registry                 // ids held by this store's open transactions
	// noRegistry makes every claim ask the database, as a claim from
	// another process does (testhook.WithoutRegistry).
	noRegistry bool
	// waitingInsert: the MySQL-dialect server has no SET STATEMENT
	// (MySQL, not MariaDB), so an INSERT cannot be told not to wait for
	// another transaction's uncommitted row of the same id; claims in the
	// caller's transaction probe for one on a connection of their own
	// first (see claimMySQLJoined). Learnt at the first INSERT.
	waitingInsert atomic.Bool
	// oneWriter: every process writes through one node of the cluster
	// (WithOneWriterNode), so MultiPrimary reports false.
	oneWriter bool
	// wsrep: whether the server is a Galera node that other nodes write
	// to (onGalera), learnt at the first claim that needs to know.
	wsrep atomic.Int32
}

var (
	_ store.Store   = (*Store)(nil)
	_ store.TxStore = (*Store)(nil)
)

// Option configures New.
type Option interface{ apply(*Store) error }

type optionFunc func(*Store) error

func (f optionFunc) apply(s *Store) error { return f(s) }

// WithTable sets the table name (default DefaultTable, "idempotency_records").
// The name must start with a letter or an underscore, hold only ASCII
// letters, digits and underscores, and be at most 48 bytes; it is used
// unquoted, so Postgres folds it to lower case. The index is named
// "<table>_expires_at_idx". To use another Postgres schema, put it on the
// connection's search_path.
func WithTable(name string) Option {
	return optionFunc(func(s *Store) error {
		if err := validTable(name); err != nil {
			return err
		}
		s.table = name
		return nil
	})
}

// WithTxOptions sets the options Begin starts transactions with (default:
// READ COMMITTED on MySQL/MariaDB, where REPEATABLE READ would take gap
// locks on the probe of a missing key, which Begin's claim runs first;
// the database's default elsewhere). On MySQL/MariaDB, SERIALIZABLE is
// refused (New returns an error wrapping core.ErrConfig): InnoDB reads
// with locks at that level, and a claim must not wait for another
// transaction's claim; Check refuses a session default of SERIALIZABLE
// the same way.
// Pass &sql.TxOptions{} to use the session default on every dialect, for
// example when the MySQL DSN already sets transaction_isolation.
func WithTxOptions(opts *sql.TxOptions) Option {
	return optionFunc(func(s *Store) error {
		s.txOpts = opts
		return nil
	})
}

// WithRequireSyncWait makes Check fail (core.ErrConfig) when the server is
// a MariaDB Galera node (@@wsrep_on) and the store's connections read
// without wsrep_sync_wait (bit 1, READ): set wsrep_sync_wait=1 in the DSN
// (go-sql-driver/mysql sends it as a session variable on connect). Galera
// does not need it for exactly-once (certification decides), but without
// it a node may not see another node's recorded answer yet, so a retry
// that lands there runs the handler and loses certification instead of
// replaying (see the README, "On MariaDB Galera"). Check cannot warn, so
// it asks only when told to. On other servers the option checks nothing.
func WithRequireSyncWait() Option {
	return optionFunc(func(s *Store) error {
		s.syncWait = true
		return nil
	})
}

// WithOneWriterNode tells the store that every process of the service
// writes through one node of its MariaDB Galera cluster (a router that
// sends every write to one node: MaxScale's readwritesplit, ProxySQL
// with one writer hostgroup, or every DSN naming the same node). Then
// MultiPrimary reports false, and a completer runs finishers
// (core.Finish) on atomic routes, which it refuses on a Galera node
// otherwise (see store.MultiPrimary). It is a promise about the
// deployment the store cannot check: with writes on two nodes, an
// atomic finisher and a client's retry can both charge. Default: off.
func WithOneWriterNode() Option {
	return optionFunc(func(s *Store) error {
		s.oneWriter = true
		return nil
	})
}

// The option without the registry is for idem's own tests of the
// cross-process path (testhook.WithoutRegistry).
func init() {
	testhook.WithoutRegistry = func() any {
		return Option(optionFunc(func(s *Store) error {
			s.noRegistry = true
			return nil
		}))
	}
}

// New returns a store that keeps records in a table of db, written in
// dialect d. It does not create the table: run Migrate, or apply Schema(d,
// table) (also shipped as migrations/<dialect>/*.sql) with your migration
// tool.
//
// Connection settings the store relies on:
//   - MySQL/MariaDB (github.com/go-sql-driver/mysql): loc=UTC (the
//     driver's default), parseTime=true recommended; interpolateParams=true
//     saves a prepare round trip per statement.
//   - SQLite (modernc.org/sqlite): _pragma=busy_timeout(5000),
//     _pragma=journal_mode(WAL) and _txlock=immediate; see the README.
func New(db *sql.DB, d Dialect, opts ...Option) (*Store, error) {
	if db == nil {
		return nil, fmt.Errorf("%w: sqlstore: nil *sql.DB", core.ErrConfig)
	}
	if !d.valid() {
		return nil, fmt.Errorf("%w: sqlstore: unknown dialect %d", core.ErrConfig, d)
	}
	s := &Store{db: db, d: d, table: DefaultTable}
	if d == MySQL {
		s.txOpts = &sql.TxOptions{Isolation: sql.LevelReadCommitted}
	}
	for _, o := range opts {
		if o == nil {
			continue
		}
		if err := o.apply(s); err != nil {
			return nil, err
		}
	}
	if d == MySQL && s.txOpts != nil && s.txOpts.Isolation == sql.LevelSerializable {
		return nil, errMySQLSerializable
	}
	s.q = d.queries(s.table)
	s.mq = storeutil.MarkSQL(s.table, d.flavor())
	s.lock = pgsql.Fnv64(s.table)
	return s, nil
}

// errMySQLSerializable refuses MySQL/MariaDB at SERIALIZABLE: InnoDB turns
// every plain read of a transaction into a locking read there, so the
// claim's read of a row another transaction is claiming would wait for
// that transaction instead of answering in progress at once.
var errMySQLSerializable = fmt.Errorf("%w: sqlstore: MySQL/MariaDB transactions at SERIALIZABLE make the claim's reads wait for other transactions' claims (InnoDB reads with locks there): "+
	"use READ COMMITTED (the store's default) or REPEATABLE READ, with WithTxOptions or the session's transaction_isolation", core.ErrConfig)

func validTable(name string) error { return storeutil.ValidTable("sqlstore", name) }

// Dialect reports the store's dialect.
func (s *Store) Dialect() Dialect { return s.d }

// TxOptions reports the options Begin starts transactions with (see
// WithTxOptions); gormstore begins GORM transactions with them.
func (s *Store) TxOptions() *sql.TxOptions { return s.txOpts }

// Table reports the store's table name.
func (s *Store) Table() string { return s.table }

// Migrate creates the table and its index if they do not exist (the
// statements of Schema), and the marks table of the completer with its
// index (MarksSchema). Use it for tests and small deployments; otherwise
// ship the files in migrations/ with your migration tool.
//
// Migrate first checks the server against the dialect (as Check does), so
// a wrong dialect fails with an error wrapping core.ErrConfig that names
// the right one. Several processes may migrate at once: on Postgres, where two concurrent
// CREATE TABLE IF NOT EXISTS can fail on the catalog's unique indexes, the
// statements run in one transaction behind an advisory lock derived from
// the table name; MySQL/MariaDB and SQLite need no lock.
func (s *Store) Migrate(ctx context.Context) error {
	stmts := append(s.d.schema(s.table), storeutil.MarksSchema(s.table, s.d.flavor())...)
	c, inTx, err := s.conn(ctx)
	if err != nil {
		return err
	}
	if err := s.checkServer(ctx, c); err != nil {
		return err // a wrong dialect: say so, not "pg_advisory_xact_lock does not exist"
	}
	if s.d == Postgres && !inTx {
		return s.inShortTx(ctx, func(c Conn) error {
			if _, err := c.ExecContext(ctx, `SELECT pg_advisory_xact_lock($1)`, pgsql.MigrateLockKey(s.table)); err != nil {
				return unavailable("migrate lock", err)
			}
			return execAll(ctx, c, stmts)
		})
	}
	return execAll(ctx, c, stmts)
}

func execAll(ctx context.Context, c Conn, stmts []string) error {
	for _, stmt := range stmts {
		if _, err := c.ExecContext(ctx, stmt); err != nil {
			return unavailable("migrate", err)
		}
	}
	return nil
}

// --- transactions ------------------------------------------------------------

type connKey struct{}

// WithTx returns a context carrying the application's own transaction
// (caller-managed atomic mode): store methods called with it run in tx, and
// the engine sees InTx and never commits or rolls back. The store never
// commits tx; the caller does, after Complete.
func WithTx(ctx context.Context, tx *sql.Tx) context.Context {
	if tx == nil {
		return ctx
	}
	return context.WithValue(ctx, connKey{}, Conn(tx))
}

// WithConn is WithTx for a transaction held as another type that runs
// statements on one database session: a gorm.ConnPool bound to a GORM
// transaction, an *sqlx.Tx. c must be in a transaction for atomic mode to
// hold; the store runs every statement on it.
func WithConn(ctx context.Context, c Conn) context.Context {
	if c == nil {
		return ctx
	}
	return context.WithValue(ctx, connKey{}, c)
}

// Tx returns the *sql.Tx of the transaction ctx carries (set by Begin or
// WithTx). In middleware-managed atomic mode handlers call it with the
// request's context (r.Context(), c.Request.Context(),
// c.Request().Context()) and run their business writes on it; in a Leased
// route it is the attempt's own transaction, which commits with the
// attempt's completion once the handler returns (docs/contract.md,
// section 5), so the handler neither commits nor rolls it back either way.
// Begin defers
// BEGIN to the transaction's first statement (the claim, so a handler's
// transaction has begun); Tx begins it if nothing has, and returns that
// error if it fails.
//
// When ctx carries no transaction, Tx returns an error wrapping
// core.ErrNoTx that names the fix: a framework's context was passed
// instead of the request's, or the code does not run in a protected
// request.
func Tx(ctx context.Context) (*sql.Tx, error) {
	c, err := ConnFrom(ctx)
	if err != nil {
		return nil, err
	}
	if c == nil {
		return nil, noTx(ctx, "sqlstore.Tx", "*sql.DB")
	}
	tx, ok := c.(*sql.Tx)
	if !ok {
		return nil, fmt.Errorf("%w: sqlstore.Tx: the context carries a %T (WithConn), not a *sql.Tx: use sqlstore.ConnFrom", core.ErrNoTx, c)
	}
	return tx, nil
}

// noTx is the error of a transaction accessor (call) given a context
// without a transaction; own names what the application should use
// instead on a Leased route.
func noTx(ctx context.Context, call, own string) error {
	if info, ok := core.AttemptFrom(ctx); ok && !info.Atomic {
		return fmt.Errorf("%w: %s: this Leased attempt has no transaction of its own (it could not begin one: see the log); use your own %s", core.ErrNoTx, call, own)
	}
	return fmt.Errorf("%w: %s needs the request's context of a route in atomic mode: c.Request.Context() (Gin), c.Request().Context() (Echo), r.Context() (net/http, chi); "+
		"code that holds its own transaction passes it with sqlstore.WithTx", core.ErrNoTx, call)
}

// TxFrom returns the *sql.Tx that ctx carries, or nil: for code that runs
// both inside and outside atomic mode and falls back to the pool itself.
// Handlers of atomic routes call Tx, which fails loudly instead of
// returning nil. If beginning the deferred transaction fails, TxFrom
// returns nil (Tx and ConnFrom return the error).
func TxFrom(ctx context.Context) *sql.Tx {
	c, _ := ConnFrom(ctx)
	tx, _ := c.(*sql.Tx)
	return tx
}

// ConnFrom returns the connection of the transaction ctx carries (Begin,
// BeginWith, WithTx, WithConn), beginning it if it has not begun, or nil
// and no error when ctx carries none.
func ConnFrom(ctx context.Context) (Conn, error) {
	switch v := ctx.Value(connKey{}).(type) {
	case *lazyTx:
		return v.connection()
	case Conn:
		return v, nil
	}
	return nil, nil
}

// hiddenTx marks a context whose transaction WithoutTx hid; it keeps the
// hidden value (a *lazyTx of Begin, or the caller's transaction).
type hiddenTx struct{ v any }

// mayHoldWriteLock reports whether the hidden transaction may hold (or
// take, at its first write) SQLite's write lock: a transaction of Begin
// that has ended holds none (an outer layer that gave its request to a
// nested leased one rolled it back); of any other the store cannot tell.
func (h hiddenTx) mayHoldWriteLock() bool {
	l, ok := h.v.(*lazyTx)
	if !ok {
		return true
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return !l.closed
}

// WithoutTx returns ctx with the transaction it carries (Begin, WithTx,
// WithConn) hidden: store methods called with it run on the pool, in
// autocommit, and InTx reports false (store.TxStore). The engine claims and
// completes leased routes with it.
//
// SQLite admits one writer at a time: a statement on another connection
// waits (busy_timeout) for the hidden transaction, which holds the write
// lock from BEGIN IMMEDIATE (the recommended _txlock=immediate) or from
// its first write, and which in turn waits for the request. So on SQLite,
// Claim with a context whose transaction was hidden, and may hold that
// lock, fails at once with an error matching core.ErrConfig: keep leased routes out of a
// transaction-per-request middleware.
func (s *Store) WithoutTx(ctx context.Context) context.Context {
	v := ctx.Value(connKey{})
	if _, hidden := v.(hiddenTx); v == nil || hidden {
		return ctx
	}
	return context.WithValue(ctx, connKey{}, hiddenTx{v})
}

// InTx reports whether ctx carries a transaction (Begin, WithTx, WithConn).
func (s *Store) InTx(ctx context.Context) bool {
	switch ctx.Value(connKey{}).(type) {
	case nil, hiddenTx:
		return false
	}
	return true
}

// Begin starts a transaction (with the WithTxOptions options) and returns a
// context carrying it. The transaction is bound to ctx: cancelling ctx rolls
// it back.
//
// BEGIN is deferred to the transaction's first statement, normally the
// claim, which first asks the store's registry of in-flight ids: a
// duplicate of a request that this process is running answers in progress
// at once, without taking a connection from the pool (nor, on SQLite,
// waiting for the write lock); see the README. TxFrom gives the handler
// the *sql.Tx.
func (s *Store) Begin(ctx context.Context) (context.Context, store.Tx, error) {
	return s.BeginWith(ctx, func(ctx context.Context) (Conn, store.Tx, error) {
		if s.d == SQLite {
			return beginPinned(ctx, s.db, s.txOpts)
		}
		tx, err := beginTx(ctx, s.db, s.txOpts)
		if err != nil {
			return nil, nil, err
		}
		return tx, tx, nil
	})
}

// BeginWith is Begin for a layer that begins transactions its own way
// (gormstore begins GORM transactions): begin, called at the
// transaction's first statement with a context of the transaction's own
// (ctx's values, deadline and cancellation, which it passes on until the
// transaction ends, so that a replay's ROLLBACK can run after its
// answer), returns the connection the store runs on
// in the transaction and the transaction the engine commits or rolls back.
// BeginWith itself does not fail; an error of begin is the first
// statement's.
func (s *Store) BeginWith(ctx context.Context, begin BeginFunc) (context.Context, store.Tx, error) {
	l := &lazyTx{s: s, ctx: ctx, begin: begin}
	return context.WithValue(ctx, connKey{}, l), l, nil
}

// conn returns the connection for ctx: the transaction it carries (begun
// now if Begin deferred it), or the pool (autocommit).
func (s *Store) conn(ctx context.Context) (c Conn, inTx bool, err error) {
	switch v := ctx.Value(connKey{}).(type) {
	case *lazyTx:
		c, err := v.connection()
		if err != nil {
			return nil, true, unavailable("begin", err)
		}
		return c, true, nil
	case Conn:
		return v, true, nil
	}
	return s.db, false, nil
}

// inShortTx runs fn in ctx's transaction, or in a short transaction of its
// own that commits when fn returns nil.
func (s *Store) inShortTx(ctx context.Context, fn func(c Conn) error) error {
	if c, ok, err := s.conn(ctx); err != nil || ok {
		if err != nil {
			return err
		}
		return fn(c)
	}
	tx, err := beginTx(ctx, s.db, s.txOpts)
	if err != nil {
		return unavailable("begin", err)
	}
	if err := fn(tx); err != nil {
		_ = tx.Rollback()
		return err
	}
	if err := tx.Commit(); err != nil {
		return unavailable("commit", err)
	}
	return nil
}

// --- store.Store --------------------------------------------------------------

// Claim implements store.Store. See the dialect notes in the README for the
// statements it runs and how it detects another transaction's uncommitted
// claim without waiting for it.
//
// Before any statement, Claim asks the store's registry of ids held by its
// own open transactions (registry.go): a duplicate of a request that this
// process is running answers in progress without a connection or a round
// trip, on every dialect; on SQLite, which cannot probe, that is the only
// way to answer without waiting.
func (s *Store) Claim(ctx context.Context, req store.ClaimRequest) (store.ClaimResult, error) {
	req.Caller, req.Scope, req.Key = debugtext.Clean(req.Caller), debugtext.Clean(req.Scope), debugtext.Clean(req.Key)
	// A claim may wait in the registry for another claim of the same id
	// only while it holds no lock and no connection: outside any
	// transaction, or in a transaction of Begin that has not begun. Only
	// Begin's transactions register: the store sees them end.
	// A transaction begun by another Store value (with a context handed
	// across stores) is treated like a caller-managed one: its end would
	// clear the other store's registry, not this one's.
	v := ctx.Value(connKey{})
	if h, hidden := v.(hiddenTx); hidden {
		if s.d == SQLite && h.mayHoldWriteLock() {
			return store.ClaimResult{}, fmt.Errorf("%w: sqlstore: a leased route runs in a transaction of the request's context (a transaction-per-request middleware, sqlstore.WithTx): "+
				"SQLite admits one writer, so the record, which must commit on its own connection, would wait for that transaction while it waits for the route; "+
				"keep leased routes out of the middleware's transaction", core.ErrConfig)
		}
		v = nil
	}
	l, _ := v.(*lazyTx)
	wait := v == nil || (l != nil && !l.started())
	if l != nil && l.s != s {
		l = nil
	}
	var (
		cl    *inflight.Claimant[*lazyTx]
		held  bool
		found *store.Record
		err   error
	)
	if !s.noRegistry {
		cl, held, found, err = s.reg.Enter(ctx, req.ID, l, wait, req.Now, func(ctx context.Context) (*store.Record, error) { return s.peek(ctx, req) })
	}
	switch {
	case err != nil:
		return store.ClaimResult{}, unavailable("claim", err)
	case held:
		return storeutil.InProgressElsewhere(req.ID), nil
	case found != nil:
		return store.ClaimResult{Record: *found}, nil
	}
	if cl != nil {
		// Settle even if the claim panics: claims of the same id wait
		// for it.
		settled := false
		defer func() {
			if !settled {
				s.reg.Settle(cl, req.ID, false, nil)
			}
		}()
		res, err := s.claimIn(ctx, req)
		claimed := err == nil && res.Claimed && l.hold(req.ID)
		var found *store.Record
		if err == nil && !res.Claimed {
			found = &res.Record
		}
		s.reg.Settle(cl, req.ID, claimed, found)
		settled = true
		return res, err
	}
	return s.claimIn(ctx, req)
}

// claimIn runs the dialect's claim.
func (s *Store) claimIn(ctx context.Context, req store.ClaimRequest) (store.ClaimResult, error) {
	switch s.d {
	case Postgres:
		return s.claimPostgres(ctx, req)
	case MySQL:
		return s.claimMySQL(ctx, req)
	}
	return s.claimSQLite(ctx, req)
}

// Extend implements store.Store. The store cannot tell an expired record
// from a live one here (no time is passed in): the token decides.
func (s *Store) Extend(ctx context.Context, id store.ID, token int64, leaseUntil time.Time) error {
	c, inTx, err := s.conn(ctx)
	if err != nil {
		return err
	}
	lu := s.d.timeArg(leaseUntil)
	res, err := s.exec(ctx, c, inTx, s.q.extend, lu, lu, id[:], token)
	if err != nil {
		return s.failure(ctx, "extend", err)
	}
	return s.fenced(ctx, c, res, s.q.isInProgress, id, token)
}

// Complete implements store.Store.
func (s *Store) Complete(ctx context.Context, id store.ID, token int64, cp store.Completion) error {
	if cp.State != store.StateCompleted && cp.State != store.StateIndeterminate {
		return fmt.Errorf("%w: sqlstore: Complete with state %v", core.ErrConfig, cp.State)
	}
	c, inTx, err := s.conn(ctx)
	if err != nil {
		return err
	}
	res, err := s.exec(ctx, c, inTx, s.q.complete, int16(cp.State), cp.Status, storeutil.NullBytes(cp.Response), s.d.timeArg(cp.ExpiresAt), id[:], token)
	if err != nil {
		return s.failure(ctx, "complete", err)
	}
	return s.fenced(ctx, c, res, s.q.isHeld, id, token)
}

// fenced turns the result of a fenced UPDATE into nil or ErrFenced. MySQL
// reports changed rows, not matched rows (unless the DSN sets
// clientFoundRows=true), so an UPDATE that rewrote identical values reports
// 0: then one more SELECT tells a matched row from a fenced one.
func (s *Store) fenced(ctx context.Context, c Conn, res sql.Result, check string, id store.ID, token int64) error {
	n, err := res.RowsAffected()
	if err != nil {
		return unavailable("rows affected", err)
	}
	if n > 0 {
		return nil
	}
	if s.d == MySQL {
		var one int
		switch err := c.QueryRowContext(ctx, check, id[:], token).Scan(&one); {
		case err == nil:
			return nil
		case !errors.Is(err, sql.ErrNoRows):
			return unavailable("fence check", err)
		}
	}
	return core.ErrFenced
}

// Release implements store.Store.
func (s *Store) Release(ctx context.Context, id store.ID, token int64) error {
	c, inTx, err := s.conn(ctx)
	if err != nil {
		return err
	}
	res, err := s.exec(ctx, c, inTx, s.q.release, id[:], token)
	if err != nil {
		return s.failure(ctx, "release", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return unavailable("rows affected", err)
	}
	if n > 0 {
		return nil
	}
	var one int
	switch err := c.QueryRowContext(ctx, s.q.exists, id[:]).Scan(&one); {
	case errors.Is(err, sql.ErrNoRows):
		return nil // missing: nothing to release
	case err != nil:
		return unavailable("release check", err)
	}
	return core.ErrFenced
}

// Get implements store.Store.
func (s *Store) Get(ctx context.Context, id store.ID, now time.Time) (store.Record, error) {
	c, _, err := s.conn(ctx)
	if err != nil {
		return store.Record{}, err
	}
	var rec store.Record
	_, err = scanRecord(c.QueryRowContext(ctx, s.q.get, id[:], s.d.timeArg(now)), &rec)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return store.Record{}, core.ErrNotFound
	case err != nil:
		return store.Record{}, unavailable("get", err)
	}
	return rec, nil
}

// DeleteExpired implements store.Store: one batch of at most limit rows,
// oldest first, skipping rows another transaction has locked (Postgres,
// MySQL/MariaDB), so concurrent sweepers and live claims never wait on it.
func (s *Store) DeleteExpired(ctx context.Context, now time.Time, limit int) (int, error) {
	if limit <= 0 {
		return 0, nil
	}
	if s.d != MySQL {
		c, _, err := s.conn(ctx)
		if err != nil {
			return 0, err
		}
		res, err := c.ExecContext(ctx, s.q.deleteExpired, s.d.timeArg(now), limit)
		if err != nil {
			return 0, unavailable("delete expired", err)
		}
		n, err := res.RowsAffected()
		if err != nil {
			return 0, unavailable("rows affected", err)
		}
		return int(n), nil
	}
	return s.deleteExpiredMySQL(ctx, now, limit)
}

// --- helpers -----------------------------------------------------------------

// failure wraps the driver error of a statement run with ctx: with
// core.ErrTxAborted when the database aborted the transaction that ctx
// carries (see aborted), and then also with core.ErrLostRace when it did so
// in favour of a concurrent transaction (see isLostRace); else as
// unavailable does.
func (s *Store) failure(ctx context.Context, op string, err error) error {
	if v := ctx.Value(connKey{}); v != nil && s.aborted(err) {
		if _, hidden := v.(hiddenTx); hidden {
			return unavailable(op, err) // ran on the pool, in autocommit
		}
		if isLostRace(err) {
			return fmt.Errorf("%w: %w: sqlstore: %s: %w", core.ErrTxAborted, core.ErrLostRace, op, err)
		}
		return fmt.Errorf("%w: sqlstore: %s: %w", core.ErrTxAborted, op, err)
	}
	return unavailable(op, err)
}

// aborted reports whether err says that the database aborted the
// transaction the statement ran in, so that no statement can run in it
// any more: on Postgres SQLSTATE 25P02 (an earlier statement failed:
// "current transaction is aborted, commands ignored until end of
// transaction block"), 40001 (serialization failure) and 40P01 (deadlock
// victim); on MySQL/MariaDB a deadlock victim or a failed Galera
// certification (1213: the whole transaction was rolled back). SQLite and
// MySQL undo a failed statement alone.
func (s *Store) aborted(err error) bool {
	switch s.d {
	case Postgres:
		var st interface{ SQLState() string } // pgconn.PgError, pq.Error
		if !errors.As(err, &st) {
			return false
		}
		switch st.SQLState() {
		case "25P02", "40001", "40P01":
			return true
		}
		return false
	case MySQL:
		return mysqlErrno(err) == erDeadlock
	}
	return false
}

// unavailable wraps a driver error with core.ErrStoreUnavailable, or with
// core.ErrLostRace when the database rolled the transaction back for a
// concurrent one (see isLostRace); both stay inspectable with errors.Is /
// errors.As.
func unavailable(op string, err error) error {
	if errors.Is(err, core.ErrStoreUnavailable) || errors.Is(err, core.ErrLostRace) || errors.Is(err, core.ErrTxAborted) {
		return err
	}
	if isLostRace(err) {
		return fmt.Errorf("%w: sqlstore: %s: %w", core.ErrLostRace, op, err)
	}
	return fmt.Errorf("%w: sqlstore: %s: %w", core.ErrStoreUnavailable, op, err)
}

// isLostRace reports whether err says that the database rolled the whole
// transaction back in favour of a concurrent one: MySQL/MariaDB error 1213
// (SQLSTATE 40001), which InnoDB gives a deadlock victim and MariaDB
// Galera gives a transaction that failed certification at COMMIT or was
// aborted by another node's replicated write ("WSREP detected
// deadlock/conflict and aborted the transaction"). Galera's 1047 ("WSREP
// has not yet prepared node for application use": the node is not in the
// primary component) is not one: that node is out of service, so it stays
// ErrStoreUnavailable (503), and fail-open applies to it. Postgres's
// serialization failures and deadlocks (40001, 40P01) are not either: its
// claims of one identity serialize on an advisory lock and the unique
// index, so those are about the handler's own rows (core.ErrTxAborted
// alone; see core.ErrLostRace and docs/decisions.md).
func isLostRace(err error) bool {
	return mysqlErrno(err) == erDeadlock
}

// readExisting reads the committed row of req.ID without locking. ok is
// true when that row answers the claim: it is live and cannot be claimed
// (neither expired nor a lapsed lease that req may take over).
func (s *Store) readExisting(ctx context.Context, c Conn, req store.ClaimRequest) (res store.ClaimResult, ok bool, err error) {
	var rec store.Record
	found, err := scanRecord(c.QueryRowContext(ctx, s.q.read, req.ID[:]), &rec)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return store.ClaimResult{}, false, nil
	case err != nil:
		return store.ClaimResult{}, false, unavailable("claim read", err)
	}
	if found && storeutil.Live(rec, req.Now) && !storeutil.Takeable(rec, req) {
		return store.ClaimResult{Record: rec}, true, nil
	}
	return store.ClaimResult{}, false, nil
}

// peek reads the committed row of req.ID for the registry (inflight.Peek):
// outside any transaction, on a connection of the pool. When the pool is
// at its limit with none idle, it waits for one at most
// inflight.ClaimWait; otherwise the pool opens one (not bounded: opening
// a connection on a busy machine takes longer than ClaimWait, and is no
// turn behind anyone). A plain read waits for no lock (SQLite in WAL mode,
// as the README recommends; Postgres and InnoDB read a snapshot).
func (s *Store) peek(ctx context.Context, req store.ClaimRequest) (*store.Record, error) {
	cctx, cancel := ctx, context.CancelFunc(func() {})
	if st := s.db.Stats(); st.MaxOpenConnections > 0 && st.Idle == 0 && st.OpenConnections >= st.MaxOpenConnections {
		cctx, cancel = context.WithTimeout(ctx, inflight.ClaimWait)
	}
	conn, err := s.db.Conn(cctx)
	cancel()
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	res, ok, err := s.readExisting(ctx, conn, req)
	if err != nil || !ok {
		return nil, err
	}
	return &res.Record, nil
}

// maxClaimTries bounds the retries of a claim that lost a race against a
// transaction that committed between two of its steps.
const maxClaimTries = 3

// beginPinned begins a transaction on a connection taken from db for it
// alone (SQLite). A COMMIT that SQLite refuses (a deferred foreign key
// that fails) leaves the transaction open on its connection, and
// database/sql would hand that connection back to the pool, where every
// later BEGIN on it fails ("cannot start a transaction within a
// transaction"). Pinned, the failed COMMIT is followed by a ROLLBACK on the
// same connection before it goes back.
func beginPinned(ctx context.Context, db *sql.DB, opts *sql.TxOptions) (Conn, store.Tx, error) {
	conn, err := db.Conn(ctx)
	if err != nil {
		return nil, nil, err
	}
	tx, err := conn.BeginTx(ctx, opts)
	if err != nil {
		_ = conn.Close()
		return nil, nil, err
	}
	return tx, pinnedTx{tx: tx, conn: conn}, nil
}

// pinnedTx is a transaction on a connection of its own (beginPinned).
type pinnedTx struct {
	tx   *sql.Tx
	conn *sql.Conn
}

func (p pinnedTx) Commit() error {
	err := p.tx.Commit()
	if err != nil {
		// A refused COMMIT (or the handler's own, refused) leaves the
		// transaction open; with none open SQLite just refuses this.
		_, _ = p.conn.ExecContext(context.Background(), "ROLLBACK")
	}
	_ = p.conn.Close()
	return err
}

func (p pinnedTx) Rollback() error {
	err := p.tx.Rollback()
	if err != nil {
		// Ended before (the handler's own Commit, which SQLite may have
		// refused, leaving the transaction open): roll back on the
		// connection itself before it goes back to the pool.
		_, _ = p.conn.ExecContext(context.Background(), "ROLLBACK")
	}
	_ = p.conn.Close()
	return err
}

// beginTx is db.BeginTx, sent again on another connection when it fails
// for any reason but ctx's end, up to maxBeginTries times. BEGIN commits
// nothing, so sending it again is always safe; and it is what meets a
// pooled connection the server closed (a restart, a failover, an idle
// timeout): database/sql sends a statement again on another connection
// only when the driver says the connection was bad before anything was
// sent, which pgx's database/sql driver does for queries but not for
// BEGIN, so after a restart every dead pooled connection was one 503
// (reliability TestDatabaseFaults, sqlstore/postgres/atomic, seed
// 5818398709639288509). A failed BEGIN's connection is discarded.
func beginTx(ctx context.Context, db *sql.DB, opts *sql.TxOptions) (*sql.Tx, error) {
	var err error
	for range maxBeginTries(db) {
		var tx *sql.Tx
		if tx, err = db.BeginTx(ctx, opts); err == nil || ctx.Err() != nil {
			return tx, err
		}
	}
	return nil, err
}

// maxBeginTries bounds beginTx: every connection of the pool once, and one
// new one (at most 16 when the pool is unbounded).
func maxBeginTries(db *sql.DB) int {
	if n := db.Stats().MaxOpenConnections; n > 0 && n < 16 {
		return n + 1
	}
	return 16
}
