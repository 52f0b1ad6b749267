package pgxstore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/store"
	"github.com/idemkit/idem/core/syncclock"
	"github.com/idemkit/idem/internal/debugtext"
	"github.com/idemkit/idem/internal/inflight"
	"github.com/idemkit/idem/internal/pgsql"
	"github.com/idemkit/idem/internal/storeutil"
)

// DefaultTable is the table name used when WithTable is not given; it is
// sqlstore's, so both stores can share one table.
const DefaultTable = "idempotency_records"

// Store is a store.TxStore on a pgx pool. Create it with New.
type Store struct {
	pool  *pgxpool.Pool
	table string
	q     pgsql.Statements
	list  [4]string                // List's statements (inspect.go)
	mq    storeutil.MarkStatements // store.Settler's (settle.go)
	// commitComplete is the completion sent in the same round trip as
	// COMMIT: q.Complete, failing (division by zero) when it matched no
	// row, so that the COMMIT behind it does not run.
	commitComplete string
	lock           uint64 // mixed into the advisory lock keys (per table)
	reg            registry
	noRegistry     bool // tests only: every claim asks the database
	// bg counts the rollbacks running off the requests' paths;
	// rollbackGate (tests only), when set, holds them until closed.
	bg           sync.WaitGroup
	rollbackGate chan struct{}
}

// background runs fn (a ROLLBACK) off the request's path.
func (s *Store) background(fn func()) {
	gate := s.rollbackGate
	s.bg.Go(func() {
		if gate != nil {
			<-gate
		}
		fn()
	})
}

var (
	_ store.Store          = (*Store)(nil)
	_ store.TxStore        = (*Store)(nil)
	_ syncclock.TimeSource = (*Store)(nil)
)

// Option configures New.
type Option interface{ apply(*Store) error }

type optionFunc func(*Store) error

func (f optionFunc) apply(s *Store) error { return f(s) }

// WithTable sets the table name (default DefaultTable,
// "idempotency_records"). The name must start with a letter or an
// underscore, hold only ASCII letters, digits and underscores, and be at
// most 48 bytes; it is used unquoted, so Postgres folds it to lower case.
func WithTable(name string) Option {
	return optionFunc(func(s *Store) error {
		if err := validTable(name); err != nil {
			return err
		}
		s.table = name
		return nil
	})
}

// New returns a store that keeps records in a table reached through pool.
// It does not create the table: run Migrate, or apply sqlstore's
// migrations/postgres files (the table is the same) with your migration
// tool.
func New(pool *pgxpool.Pool, opts ...Option) (*Store, error) {
	if pool == nil {
		return nil, fmt.Errorf("%w: pgxstore: nil *pgxpool.Pool", core.ErrConfig)
	}
	s := &Store{pool: pool, table: DefaultTable}
	for _, o := range opts {
		if o == nil {
			continue
		}
		if err := o.apply(s); err != nil {
			return nil, err
		}
	}
	s.q = pgsql.New(s.table)
	s.list = listStatements(s.table)
	s.mq = storeutil.MarkSQL(s.table, storeutil.Postgres)
	s.commitComplete = `WITH u AS (` + s.q.Complete + ` RETURNING 1) SELECT 1 / count(*)::int FROM u`
	s.lock = pgsql.Fnv64(s.table)
	return s, nil
}

func validTable(name string) error { return storeutil.ValidTable("pgxstore", name) }

// Table reports the store's table name.
func (s *Store) Table() string { return s.table }

// Schema returns the DDL of the store's table and its expiry index (the
// statements Migrate runs), as sqlstore.Schema(sqlstore.Postgres, table)
// and sqlstore's migrations/postgres files hold it.
func (s *Store) Schema() string {
	return strings.Join(pgsql.Schema(s.table), ";\n\n") + ";\n"
}

// Migrate creates the table and its index if they do not exist. Several
// processes may migrate at once: the statements run in one transaction
// behind an advisory lock derived from the table name (as sqlstore's).
func (s *Store) Migrate(ctx context.Context) error {
	return s.inShortTx(ctx, func(c querier) error {
		if err := s.checkServer(ctx, c); err != nil {
			return err
		}
		if _, err := c.Exec(ctx, s.q.MigrateLock, pgsql.MigrateLockKey(s.table)); err != nil {
			return unavailable("migrate lock", err)
		}
		for _, stmt := range append(pgsql.Schema(s.table), storeutil.MarksSchema(s.table, storeutil.Postgres)...) {
			if _, err := c.Exec(ctx, stmt); err != nil {
				return unavailable("migrate", err)
			}
		}
		return nil
	})
}

// querier is what the store runs its statements on: the pool, a pool
// connection, or a transaction.
type querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// resend says when a statement run outside a transaction goes again to
// another connection of the pool after its own failed.
type resend int

const (
	// ifUnsent: only when pgconn.SafeToRetry says that nothing reached the
	// server. For statements that commit on their own (autocommit writes):
	// one whose connection was lost after it was sent may have committed.
	ifUnsent resend = iota
	// ifLost: whenever the connection turns out to be lost (lost). For
	// statements that commit nothing: reads, and BEGIN with the first
	// statement of a transaction, which the server rolls back when it
	// loses the connection.
	ifLost
)

// lost reports whether a statement that failed with err on conn lost its
// connection before it could answer (ask before the connection goes back
// to the pool): pgx closes a connection on a network error and
// on a FATAL error (a server that restarts or terminates the session
// answers 57P01 to the next statement), and a pool hands out, until it
// pings them (pgxpool: after a second of idleness), the idle connections
// that the server or the network has closed. An error the server answered
// with on a live connection is not a lost connection.
func lost(conn *pgx.Conn, err error) bool {
	return err != nil && (conn.IsClosed() || pgconn.SafeToRetry(err))
}

// retry reports whether a statement that failed with err after try
// attempts, and lost its connection (lost), may go again to another
// connection under policy r, ctx (and the transaction's context tctx)
// still live: at most the pool's size plus one attempts in all, as
// pgxpool's Acquire replaces idle connections whose ping fails, so that a
// pool whose every connection died still reaches a fresh one;
// database/sql retries a bad connection so.
func (s *Store) retry(ctx, tctx context.Context, r resend, lost bool, err error, try int) bool {
	switch {
	case !lost || ctx.Err() != nil || tctx.Err() != nil:
		return false
	case r == ifUnsent && !pgconn.SafeToRetry(err):
		return false
	}
	return try <= int(s.pool.Stat().MaxConns())
}

// acquire takes a connection of the pool. One that could not be opened
// (refused, or cut while connecting) is tried once more, as before any
// statement was sent; a server that is down fails both.
func (s *Store) acquire(ctx context.Context) (*pgxpool.Conn, error) {
	conn, err := s.pool.Acquire(ctx)
	var ce *pgconn.ConnectError
	if err != nil && errors.As(err, &ce) && ctx.Err() == nil {
		conn, err = s.pool.Acquire(ctx)
	}
	return conn, err
}

// run runs fn on what statements of ctx run on: once in the transaction
// ctx carries; outside one on a connection of the pool, and again on
// another while the connection turns out to be lost and r allows it.
func (s *Store) run(ctx context.Context, r resend, fn func(c querier) error) error {
	c, inTx, err := s.conn(ctx)
	if err != nil {
		return err
	}
	if inTx {
		return fn(c)
	}
	return s.onPool(ctx, ctx, r, fn)
}

// onPool runs fn on a connection of the pool acquired with actx (outside
// any transaction), and again on another while retry allows it.
func (s *Store) onPool(ctx, actx context.Context, r resend, fn func(c querier) error) error {
	for try := 1; ; try++ {
		conn, err := s.acquire(actx)
		if err != nil {
			return unavailable("acquire", err)
		}
		err = fn(conn)
		gone := lost(conn.Conn(), err)
		conn.Release() // a lost connection is closed: the pool destroys it
		if err == nil || !s.retry(ctx, actx, r, gone, err, try) {
			return err
		}
	}
}

// inShortTx runs fn in ctx's transaction, or in a short transaction of its
// own that commits when fn returns nil.
func (s *Store) inShortTx(ctx context.Context, fn func(c querier) error) error {
	if c, ok, err := s.conn(ctx); err != nil || ok {
		if err != nil {
			return err
		}
		return fn(c)
	}
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return unavailable("begin", err)
	}
	if err := fn(tx); err != nil {
		_ = tx.Rollback(context.WithoutCancel(ctx))
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return unavailable("commit", err)
	}
	return nil
}

// --- store.Store --------------------------------------------------------------

// Claim implements store.Store with sqlstore's Postgres claim: an id never
// seen is one INSERT whose non-blocking advisory lock probe rides in its
// WHERE (claimDB). In a transaction of Begin that has not begun, BEGIN and
// the INSERT travel in one round trip.
func (s *Store) Claim(ctx context.Context, req store.ClaimRequest) (store.ClaimResult, error) {
	req.Caller, req.Scope, req.Key = debugtext.Clean(req.Caller), debugtext.Clean(req.Scope), debugtext.Clean(req.Key)
	v := ctx.Value(ctxKey{})
	if _, hidden := v.(hiddenTx); hidden {
		v = nil
	}
	l, _ := v.(*lazyTx)
	if l != nil && l.s != s {
		l = nil // another store's transaction: its end clears its own registry
	}
	if s.noRegistry {
		return s.claimDB(ctx, req, l)
	}
	wait := v == nil || (l != nil && !l.started())
	cl, held, found, err := s.reg.Enter(ctx, req.ID, l, wait, req.Now, func(ctx context.Context) (*store.Record, error) { return s.peek(ctx, req) })
	switch {
	case err != nil:
		return store.ClaimResult{}, unavailable("claim", err)
	case held:
		return storeutil.InProgressElsewhere(req.ID), nil
	case found != nil:
		return store.ClaimResult{Record: *found}, nil
	}
	if cl == nil {
		return s.claimDB(ctx, req, l)
	}
	settled := false
	defer func() {
		if !settled {
			s.reg.Settle(cl, req.ID, false, nil)
		}
	}()
	res, err := s.claimDB(ctx, req, l)
	claimed := err == nil && res.Claimed && l.hold(req.ID)
	var rec *store.Record
	if err == nil && !res.Claimed {
		rec = &res.Record
	}
	s.reg.Settle(cl, req.ID, claimed, rec)
	settled = true
	return res, err
}

// markArgs appends the parameters of m, a marked claim's mark
// (store.ClaimRequest.Mark), to the claim's args: the marked statements
// (internal/pgsql) upsert the mark in the claim's own statement. A nil m
// adds nothing.
func markArgs(args []any, m *store.Mark) []any {
	if m == nil {
		return args
	}
	return append(args, m.Route, storeutil.NullBytes(m.Request), timeArg(m.After), int32(m.Tries))
}

// claimDB runs the claim, pipelined with BEGIN when ctx carries a
// transaction of Begin that has not begun. The common path (an id never
// seen) is one INSERT that returns nothing: its affected-row count says
// claimed, and the store builds the record from req, so a first execution
// sends no read and gets no row back. When it inserts nothing (the row is
// there, or another transaction holds the id), a read follows, in a round
// trip of its own: it answers a replay and a live lease; a claimable row
// (expired, a lapsed lease), no row (another transaction holds the id and
// has not committed its row), or a row that a sweep or a release deleted
// after the INSERT saw it, take the full claim statement (claimExisting),
// which claims the id when nothing holds it.
func (s *Store) claimDB(ctx context.Context, req store.ClaimRequest, l *lazyTx) (store.ClaimResult, error) {
	lock := pgsql.LockKey(req.ID, s.lock)
	leased := l == nil && !s.InTx(ctx)
	ins := s.q.Insert
	switch {
	case req.Mark != nil && leased:
		ins = s.q.InsertLeasedMarked
	case req.Mark != nil:
		ins = s.q.InsertMarked
	case leased:
		ins = s.q.InsertLeased
	}
	inserted, err := s.claimBatch(ctx, l, func(br pgx.BatchResults) (bool, error) {
		tag, err := br.Exec()
		return err == nil && tag.RowsAffected() == 1, err
	}, stmt{ins, markArgs([]any{lock, req.ID[:], req.Caller, req.Scope, req.Key, storeutil.NullBytes(req.Fingerprint), req.Token,
		timeArg(req.LeaseUntil), timeArg(req.ExpiresAt), timeArg(req.Now)}, req.Mark)})
	switch {
	case err != nil:
		return store.ClaimResult{}, s.claimFailure(ctx, req, err)
	case inserted:
		if l != nil {
			l.claimed(req.ID, req.Token)
		}
		return store.ClaimResult{Claimed: true, Record: storeutil.NewRecord(req)}, nil
	}
	var rec store.Record
	found, err := s.claimBatch(ctx, l, func(br pgx.BatchResults) (bool, error) {
		found, err := scanRecord(br.QueryRow(), &rec)
		if errors.Is(err, pgx.ErrNoRows) {
			return false, nil
		}
		return found, err
	}, stmt{s.q.Read, []any{req.ID[:]}})
	switch {
	case err != nil:
		return store.ClaimResult{}, s.claimFailure(ctx, req, err)
	case found && storeutil.Live(rec, req.Now) && !storeutil.Takeable(rec, req):
		if l != nil && rec.State != store.StateCompleted {
			// The INSERT may have taken the lock (a row committed between
			// its snapshot and its probe): end the transaction before the
			// answer counts.
			l.lockHeld()
		}
		return store.ClaimResult{Record: rec}, nil
	}
	return s.claimExisting(ctx, req, l, lock)
}

// claimExisting claims an id whose row is there but claimable (expired, a
// lapsed lease that req may take over), or not there when the read looked
// (held by another transaction, or deleted since the INSERT saw it), with
// the full claim statement: the lock probe, INSERT ... ON CONFLICT DO
// UPDATE, and the row as it is. It runs at most maxClaimTries times.
func (s *Store) claimExisting(ctx context.Context, req store.ClaimRequest, l *lazyTx, lock int64) (store.ClaimResult, error) {
	leased := l == nil && !s.InTx(ctx)
	q := s.q.Claim
	switch {
	case req.Mark != nil && leased:
		q = s.q.ClaimLeasedMarked
	case req.Mark != nil:
		q = s.q.ClaimMarked
	case leased:
		q = s.q.ClaimLeased
	}
	claim := stmt{q, markArgs([]any{lock, req.ID[:], req.Caller, req.Scope, req.Key,
		storeutil.NullBytes(req.Fingerprint), req.Token, timeArg(req.LeaseUntil), timeArg(req.ExpiresAt),
		timeArg(req.Now), req.Takeover}, req.Mark)}
	for try := 0; ; try++ {
		var (
			ok, inserted bool
			rec          store.Record
		)
		found, err := s.claimBatch(ctx, l, func(br pgx.BatchResults) (bool, error) {
			return scanRecord(br.QueryRow(), &rec, &ok, &inserted)
		}, claim)
		if err != nil {
			return store.ClaimResult{}, s.claimFailure(ctx, req, err)
		}
		if l != nil && ok && !inserted {
			l.lockHeld() // the transaction holds the id's lock without its row
		}
		switch {
		case inserted:
			if l != nil {
				l.claimed(req.ID, req.Token)
			}
			return store.ClaimResult{Claimed: true, Record: rec}, nil
		case !ok && (!found || !storeutil.Live(rec, req.Now) || storeutil.Takeable(rec, req)):
			// Another transaction holds the identity and is creating,
			// replacing or taking over the record.
			return storeutil.InProgressElsewhere(req.ID), nil
		case found && storeutil.Live(rec, req.Now) && !(ok && storeutil.Takeable(rec, req)):
			// Completed, indeterminate, or held by a live lease.
			return store.ClaimResult{Record: rec}, nil
		}
		// We held the lock but ON CONFLICT met a row our snapshot does not
		// show (committed between the snapshot and the lock): run again
		// with a new snapshot (READ COMMITTED).
		if try+1 == maxClaimTries {
			return storeutil.InProgressElsewhere(req.ID), nil
		}
	}
}

// stmt is a statement of a batch.
type stmt struct {
	sql  string
	args []any
}

// claimBatch sends a claim's statements in one batch and reads their
// results with read: in a transaction of Begin with lazyTx.beginWith
// (behind BEGIN if it has not begun; a claim's statements do not mark
// the transaction used); in the caller's transaction on it; outside a
// transaction (leased) on a connection of the pool, in the batch's
// implicit transaction, sent again only if it was not sent (a claim that
// reached the server may have committed).
func (s *Store) claimBatch(ctx context.Context, l *lazyTx, read func(pgx.BatchResults) (bool, error), stmts ...stmt) (bool, error) {
	if l != nil {
		return l.beginWith(ctx, stmts, read)
	}
	var res bool
	send := func(c querier) (err error) {
		res, err = sendBatch(ctx, c, false, stmts, read)
		return err
	}
	c, inTx, err := s.conn(ctx)
	switch {
	case err != nil:
		return false, err
	case inTx:
		return res, send(c)
	}
	return res, s.onPool(ctx, ctx, ifUnsent, send)
}

// errBegin wraps the error of a batch's BEGIN (sendBatch).
type errBegin struct{ err error }

func (e errBegin) Error() string { return e.err.Error() }
func (e errBegin) Unwrap() error { return e.err }

// sendBatch sends stmts in one batch on c, behind BEGIN if begin is set,
// and reads their results with read. A failed BEGIN is an errBegin.
func sendBatch(ctx context.Context, c querier, begin bool, stmts []stmt, read func(pgx.BatchResults) (bool, error)) (res bool, err error) {
	b := &pgx.Batch{}
	if begin {
		b.Queue("BEGIN")
	}
	for _, st := range stmts {
		b.Queue(st.sql, st.args...)
	}
	br := c.SendBatch(ctx, b)
	defer func() {
		if cerr := br.Close(); err == nil {
			err = cerr
		}
	}()
	if begin {
		if _, err := br.Exec(); err != nil {
			return false, errBegin{err}
		}
	}
	return read(br)
}

// maxClaimTries bounds the retries of a claim that lost a race against a
// transaction that committed between two of its steps.
const maxClaimTries = 3

// Extend implements store.Store.
func (s *Store) Extend(ctx context.Context, id store.ID, token int64, leaseUntil time.Time) error {
	lu := timeArg(leaseUntil)
	var tag pgconn.CommandTag
	err := s.run(ctx, ifUnsent, func(c querier) (err error) {
		tag, err = c.Exec(ctx, s.q.Extend, lu, lu, id[:], token)
		return err
	})
	if err != nil {
		return s.failure(ctx, "extend", err)
	}
	if tag.RowsAffected() == 0 {
		return core.ErrFenced
	}
	return nil
}

// Complete implements store.Store. In a transaction of Begin that claimed
// id with token, the completion is not sent at once: it travels with
// COMMIT, in one round trip (a statement of the transaction that runs
// before then sends it first). The transaction holds the record's row from
// its claim on, so nothing can fence the completion meanwhile; should it
// still match no row, the COMMIT does not run and Commit returns an error
// wrapping core.ErrFenced.
func (s *Store) Complete(ctx context.Context, id store.ID, token int64, cp store.Completion) error {
	if cp.State != store.StateCompleted && cp.State != store.StateIndeterminate {
		return fmt.Errorf("%w: pgxstore: Complete with state %v", core.ErrConfig, cp.State)
	}
	args := []any{int16(cp.State), cp.Status, storeutil.NullBytes(bytes.Clone(cp.Response)), timeArg(cp.ExpiresAt), id[:], token}
	if l, ok := ctx.Value(ctxKey{}).(*lazyTx); ok && l.s == s {
		deferred, err := l.deferCompletion(id, token, args)
		if err != nil {
			return s.failure(ctx, "complete", err)
		}
		if deferred {
			return nil
		}
	}
	var tag pgconn.CommandTag
	err := s.run(ctx, ifUnsent, func(c querier) (err error) {
		tag, err = c.Exec(ctx, s.q.Complete, args...)
		return err
	})
	if err != nil {
		return s.failure(ctx, "complete", err)
	}
	if tag.RowsAffected() == 0 {
		return core.ErrFenced
	}
	return nil
}

// Release implements store.Store.
func (s *Store) Release(ctx context.Context, id store.ID, token int64) error {
	c, inTx, err := s.conn(ctx)
	if err != nil {
		return err
	}
	if l, ok := ctx.Value(ctxKey{}).(*lazyTx); ok {
		l.unclaimed(id)
	}
	release := func(c querier) error {
		tag, err := c.Exec(ctx, s.q.Release, id[:], token)
		if err != nil {
			return s.failure(ctx, "release", err)
		}
		if tag.RowsAffected() > 0 {
			return nil
		}
		var one int
		switch err := c.QueryRow(ctx, s.q.Exists, id[:]).Scan(&one); {
		case errors.Is(err, pgx.ErrNoRows):
			return nil // missing: nothing to release
		case err != nil:
			return s.failure(ctx, "release check", err)
		}
		return core.ErrFenced
	}
	if inTx {
		return release(c)
	}
	return s.onPool(ctx, ctx, ifUnsent, release)
}

// Get implements store.Store.
func (s *Store) Get(ctx context.Context, id store.ID, now time.Time) (store.Record, error) {
	var rec store.Record
	err := s.run(ctx, ifLost, func(c querier) (err error) {
		_, err = scanRecord(c.QueryRow(ctx, s.q.Get, id[:], timeArg(now)), &rec)
		return err
	})
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return store.Record{}, core.ErrNotFound
	case err != nil:
		return store.Record{}, s.failure(ctx, "get", err)
	}
	return rec, nil
}

// DeleteExpired implements store.Store: one batch of at most limit rows,
// oldest first, skipping rows another transaction has locked, so
// concurrent sweepers and live claims never wait on it.
func (s *Store) DeleteExpired(ctx context.Context, now time.Time, limit int) (int, error) {
	if limit <= 0 {
		return 0, nil
	}
	var tag pgconn.CommandTag
	err := s.run(ctx, ifUnsent, func(c querier) (err error) {
		tag, err = c.Exec(ctx, s.q.DeleteExpired, timeArg(now), limit)
		return err
	})
	if err != nil {
		return 0, s.failure(ctx, "delete expired", err)
	}
	return int(tag.RowsAffected()), nil
}

// Now reads the database's clock (syncclock.TimeSource), so that processes whose
// wall clocks drift agree on leases and expiry: pass it to
// syncclock.New and the synced clock to core.WithClock.
func (s *Store) Now(ctx context.Context) (time.Time, error) {
	var us int64
	if err := s.run(ctx, ifLost, func(c querier) error { return c.QueryRow(ctx, s.q.Now).Scan(&us) }); err != nil {
		return time.Time{}, unavailable("now", err)
	}
	return time.UnixMicro(us).UTC(), nil
}

// --- helpers -----------------------------------------------------------------

// failure wraps the driver error of a statement run with ctx: with
// core.ErrTxAborted when the database aborted the transaction that ctx
// carries, else with core.ErrStoreUnavailable.
func (s *Store) failure(ctx context.Context, op string, err error) error {
	switch ctx.Value(ctxKey{}).(type) {
	case nil, hiddenTx:
	default:
		if aborted(err) {
			return fmt.Errorf("%w: pgxstore: %s: %w", core.ErrTxAborted, op, err)
		}
	}
	return unavailable(op, err)
}

// aborted reports whether err says that Postgres aborted the transaction
// the statement ran in: SQLSTATE 25P02 (an earlier statement failed), 40001
// (serialization failure) or 40P01 (deadlock victim), as sqlstore reads
// them.
func aborted(err error) bool {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		return errors.Is(err, errTxFailed)
	}
	switch pe.Code {
	case "25P02", "40001", "40P01":
		return true
	}
	return false
}

// unavailable wraps a driver error with core.ErrStoreUnavailable; both stay
// inspectable with errors.Is / errors.As.
func unavailable(op string, err error) error {
	if errors.Is(err, core.ErrStoreUnavailable) || errors.Is(err, core.ErrConfig) || errors.Is(err, core.ErrTxAborted) {
		return err
	}
	return fmt.Errorf("%w: pgxstore: %s: %w", core.ErrStoreUnavailable, op, err)
}

// timeArg is t as a column value: UTC, truncated to microseconds (the
// columns keep microseconds); the zero time is NULL.
func timeArg(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	return t.UTC().Truncate(time.Microsecond)
}

// peek reads the committed row of req.ID for the registry (inflight.Peek):
// outside any transaction, on a connection of the pool. When the pool is
// at its limit with none idle, it waits for one at most
// inflight.ClaimWait; otherwise the pool opens one (not bounded: opening
// a connection on a busy machine takes longer than ClaimWait, and is no
// turn behind anyone). A plain read of a snapshot waits for no lock.
//
// A read commits nothing: when its connection turns out to be lost, it
// runs again on another (retry).
func (s *Store) peek(ctx context.Context, req store.ClaimRequest) (*store.Record, error) {
	var (
		rec  store.Record
		err  error
		gone bool
	)
	for try := 1; ; try++ {
		gone, err = s.peekOnce(ctx, req, &rec)
		if err == nil || !s.retry(ctx, ctx, ifLost, gone, err, try) {
			break
		}
	}
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return nil, nil
	case err != nil:
		return nil, err
	case storeutil.Live(rec, req.Now) && !storeutil.Takeable(rec, req):
		return &rec, nil
	}
	return nil, nil
}

// peekOnce reads the row of req.ID into rec on one connection of the
// pool; gone reports that the read lost the connection (lost).
func (s *Store) peekOnce(ctx context.Context, req store.ClaimRequest, rec *store.Record) (gone bool, err error) {
	cctx, cancel := ctx, context.CancelFunc(func() {})
	if st := s.pool.Stat(); st.IdleConns() == 0 && st.TotalConns() >= st.MaxConns() {
		cctx, cancel = context.WithTimeout(ctx, inflight.ClaimWait)
	}
	conn, err := s.acquire(cctx)
	cancel()
	if err != nil {
		return false, err
	}
	defer conn.Release()
	_, err = scanRecord(conn.QueryRow(ctx, s.q.Read, req.ID[:]), rec)
	return lost(conn.Conn(), err), err
}

// scanRecord scans the columns of pgsql.Cols into rec, after any extra
// leading destinations. found is false when the row's columns are all
// NULL (an outer join that matched nothing).
func scanRecord(r pgx.Row, rec *store.Record, extra ...any) (found bool, err error) {
	var (
		id                       []byte
		caller, scope, key       *string
		state                    *int16
		token                    *int64
		attempt, status          *int32
		leaseUntil, exp, created *time.Time
	)
	dest := append(extra, &id, &caller, &scope, &key, &rec.Fingerprint, &state, &token, &attempt,
		&leaseUntil, &exp, &created, &status, &rec.Response)
	if err := r.Scan(dest...); err != nil {
		return false, err
	}
	if id == nil {
		*rec = store.Record{}
		return false, nil
	}
	if len(id) != len(rec.ID) {
		return false, fmt.Errorf("pgxstore: id of %d bytes", len(id))
	}
	copy(rec.ID[:], id)
	rec.Caller, rec.Scope, rec.Key = deref(caller), deref(scope), deref(key)
	rec.State = store.State(deref(state))
	rec.Token = deref(token)
	rec.Attempt = int(deref(attempt))
	rec.Status = int(deref(status))
	rec.LeaseUntil, rec.ExpiresAt, rec.CreatedAt = utc(leaseUntil), utc(exp), utc(created)
	return true, nil
}

func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}

func utc(t *time.Time) time.Time {
	if t == nil {
		return time.Time{}
	}
	return t.UTC()
}
