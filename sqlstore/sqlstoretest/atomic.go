package sqlstoretest

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/store"
	"github.com/idemkit/idem/sqlstore"
)

// Fixture is one store on a fresh table, with a business table beside it
// in the same database.
type Fixture struct {
	Store store.TxStore
	// Insert writes one business row named name in the transaction that
	// ctx carries, fetched with the store's handler accessor
	// (sqlstore.Tx, gormstore.DB). It fails when ctx carries none.
	Insert func(ctx context.Context, name string) error
	// Count returns how many committed business rows are named name.
	Count func(t testing.TB, name string) int
	// Stream reads the business rows whose names start with prefix, in
	// name order, from a cursor in the transaction that ctx carries,
	// calling each for every row while the cursor is open; it returns the
	// first error of each, else the cursor's own (rows.Err). It fails when
	// ctx carries no transaction.
	Stream func(ctx context.Context, prefix string, each func(name string) error) error
	// CallerManaged begins the application's own transaction, runs fn with
	// a context that carries it (sqlstore.WithTx, gormstore.WithTx), and
	// commits when fn returns nil, else rolls back.
	CallerManaged func(ctx context.Context, fn func(ctx context.Context) error) error
	// Unique writes a row named name into a table whose names are unique,
	// in the transaction that ctx carries (like Insert): a second row of
	// one name fails with the database's unique violation.
	Unique func(ctx context.Context, name string) error
	// Counter counts the statements sent on the store's database; nil
	// skips the statement counts.
	Counter *Counter
	// AfterStatement makes every statement of the store's database call
	// hook with its text once the database has answered it, before the
	// store reads the answer; nil stops it. nil: Counter's
	// (Counter.AfterStatement); a store on another pool type (pgxstore)
	// sets its own (a pgx tracer).
	AfterStatement func(hook func(query string))
	// DB is the pool the store runs on (RunPool limits it); nil for a
	// store on another pool type (pgxstore), which then sets Hold.
	DB *sql.DB
	// Hold, when set, takes every connection of the store's pool until
	// release is called (a store whose pool is not DB); else the tests
	// shrink DB to one connection and hold that.
	Hold func(t *testing.T) (release func())
	// HoldTx, when set, runs stmt in a transaction of its own on the
	// store's database and keeps that transaction open until release,
	// which rolls it back (a store whose pool is not DB); else the tests
	// do that on DB.
	HoldTx func(t *testing.T, stmt string) (release func())
	// Twin returns another store on the same table through a pool of its
	// own, as another process would see the database.
	Twin func(t *testing.T) store.TxStore
	// Exec runs stmt in the transaction that ctx carries, through the
	// store's handler accessor (like Insert).
	Exec func(ctx context.Context, stmt string) error
	// QueryInt runs query in the transaction that ctx carries and returns
	// the integer of its one row and column.
	QueryInt func(ctx context.Context, query string) (int64, error)
	// Admin runs stmt on the store's database outside any transaction of
	// the store's (DDL, killing a session), failing t on an error.
	Admin func(t testing.TB, stmt string)
	// EndTx commits (commit true) or rolls back the transaction that ctx
	// carries the way a handler would, through the store's handler
	// accessor (sqlstore.Tx(ctx).Commit(), gormstore.DB(ctx).Rollback(),
	// pgxstore.Tx(ctx).Commit(ctx)), and returns its error (a store that
	// refuses the call returns one wrapping core.ErrConfig).
	EndTx func(ctx context.Context, commit bool) error
	// RepoTx is a repository that knows nothing of idem: it opens its own
	// transaction with ctx (GORM's db.WithContext(ctx).Transaction with the
	// plugin installed, database/sql's BeginTx through sqlstore.Joining),
	// writes one business row named name, and commits (commit true) or
	// rolls back. nil: the store offers no such join (the cases that need
	// it are not run).
	RepoTx func(ctx context.Context, name string, commit bool) error
}

// Config describes the store under test.
type Config struct {
	Dialect sqlstore.Dialect
	// New returns a fresh fixture; it registers its own cleanup.
	New func(t *testing.T) Fixture
}

// Statements per dialect in atomic mode (Begin's transactions, on
// MariaDB for MySQL), as the READMEs state them: the claim and the
// completion of a first execution (Postgres and MariaDB: the INSERT and
// the completion), and a replay (Postgres and MariaDB: the INSERT that
// inserts nothing, and the read).
var (
	firstExecution = map[sqlstore.Dialect]int64{sqlstore.Postgres: 2, sqlstore.MySQL: 2, sqlstore.SQLite: 2}
	replay         = map[sqlstore.Dialect]int64{sqlstore.Postgres: 2, sqlstore.MySQL: 2, sqlstore.SQLite: 2}
)

// failsafe bounds every wait, so a store that blocks fails the test
// instead of hanging it; latencies are logged, not asserted.
const failsafe = 10 * time.Second

var errRollback = errors.New("sqlstoretest: roll back")

type harness struct {
	cfg Config
	now time.Time
	n   int
}

// RunAtomic runs the atomic-mode scenarios against cfg's store: both ways
// into atomic mode with a real business table, the non-blocking in-flight
// probe, statement counts, and concurrent duplicates.
func RunAtomic(t *testing.T, cfg Config) {
	h := &harness{cfg: cfg, now: time.Date(2030, 1, 2, 3, 4, 5, 678901000, time.UTC)}
	for _, tc := range []struct {
		name string
		fn   func(*testing.T)
	}{
		{"ok, middleware-managed: claim, business row and completion commit together", h.middlewareCommit},
		{"ok, middleware-managed: a rollback removes the claim and the business row", h.middlewareRollback},
		{"ok, middleware-managed: a Commit after Begin's context ended commits nothing and says why", h.commitAfterCancel},
		{"ok, caller-managed: the claim joins the application's transaction and commits with it", h.callerCommit},
		{"ok, caller-managed: the application's rollback removes the claim and the business row", h.callerRollback},
		{"ok, an uncommitted claim is reported in progress without waiting", h.inFlight},
		{"ok, another process's duplicate is reported in progress without waiting (SQLite: waits, then replays)", h.twin},
		{"ok, first execution and replay cost the documented number of statements", h.statementCounts},
		{"ok, a replay's transaction ends off the caller's path (Postgres); one that wrote or claimed ends on it", h.replayRollback},
		{"ok, a record swept or released between the claim's INSERT and its read is gone: the claim claims, no 409", h.vanishedRow},
		{"ok, concurrent duplicates run the business write exactly once", h.concurrent},
		{"ok, a 4xx after a failed statement is recorded and replayed; the failed writes do not commit", h.failedStatement},
		{"ok, caller-managed: a transaction the database aborted is reported as core.ErrTxAborted", h.failedStatementCallerManaged},
		{"ok, duplicates of a claim that waits for the database answer in progress before it ends", h.blockedClaim},
		{"ok, retries of a completed request whose claim statement is slow get the replay, not in progress", h.slowReplay},
		{"ok, caller-managed at the default isolation: concurrent distinct ids neither deadlock nor fail", h.callerConcurrent},
		{"ok, caller-managed: a duplicate in another application transaction is in progress at once (SQLite: waits and replays)", h.callerInFlight},
		{"ok, however the transaction ends, a marked effect never runs again and a released key is told the truth", h.transactionEnds},
		{"ok, a COMMIT whose answer was lost but which happened gives the handler's answer, replayed to retries", h.commitOutcomeUnknown},
		{"ok, Once: a constraint checked at COMMIT after MarkEffect leaves the outcome indeterminate; the redelivery does not run", h.onceTransactionEnds},
		{"ok, a repository's own transaction joins the request's as a savepoint: its commit and its rollback are its own", h.repositoryTransaction},
		{"ok, SQLite: the handler's own COMMIT that SQLite refuses does not leave its transaction open on a pooled connection", func(t *testing.T) { atomicHandlerCommitRefused(t, h.cfg) }},
		{"ok, a claim the handler committed itself before its process died is settled indeterminate after MaxAttempt, never locked until expiry", func(t *testing.T) { atomicHandlerCommitThenCrash(t, h.cfg) }},
		{"ok, a panic after MarkEffect commits none of the handler's half-done writes; the record is indeterminate", func(t *testing.T) { panicAfterEffectCommitsPartialWrites(t, h.cfg) }},
	} {
		t.Run(tc.name, tc.fn)
	}
}

func (h *harness) req(name string, token int64) store.ClaimRequest {
	return store.ClaimRequest{
		ID:     store.Identity{Caller: "caller", Scope: "POST /orders", Key: name}.ID(),
		Caller: "caller", Scope: "POST /orders", Key: name,
		Fingerprint: []byte("fp-" + name), Token: token,
		Now: h.now, ExpiresAt: h.now.Add(24 * time.Hour),
	}
}

func (h *harness) completion(name string) store.Completion {
	return store.Completion{State: store.StateCompleted, Status: 201, Response: []byte(`{"order":"` + name + `"}`), ExpiresAt: h.now.Add(24 * time.Hour)}
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), failsafe)
	t.Cleanup(cancel)
	return ctx
}

// execute runs a first execution in middleware-managed mode: Begin, Claim,
// business insert, Complete, Commit.
func execute(ctx context.Context, f Fixture, req store.ClaimRequest, c store.Completion) (store.ClaimResult, error) {
	tctx, tx, err := f.Store.Begin(ctx)
	if err != nil {
		return store.ClaimResult{}, err
	}
	res, err := f.Store.Claim(tctx, req)
	if err != nil || !res.Claimed {
		_ = tx.Rollback()
		return res, err
	}
	if err := f.Insert(tctx, req.Key); err != nil {
		_ = tx.Rollback()
		return res, fmt.Errorf("business insert: %w", err)
	}
	if err := f.Store.Complete(tctx, req.ID, req.Token, c); err != nil {
		_ = tx.Rollback()
		return res, fmt.Errorf("complete: %w", err)
	}
	return res, tx.Commit()
}

func (h *harness) middlewareCommit(t *testing.T) {
	f, ctx := h.cfg.New(t), ctxT(t)
	req := h.req("commit", 11)
	if f.Store.InTx(ctx) {
		t.Fatal("InTx is true for a bare context")
	}
	res, err := execute(ctx, f, req, h.completion("commit"))
	if err != nil || !res.Claimed {
		t.Fatalf("first execution: %+v, %v", res, err)
	}
	if n := f.Count(t, "commit"); n != 1 {
		t.Fatalf("business rows after commit: %d, want 1", n)
	}
	rec, err := f.Store.Get(ctx, req.ID, h.now)
	if err != nil || rec.State != store.StateCompleted || rec.Status != 201 || string(rec.Response) != `{"order":"commit"}` {
		t.Fatalf("record after commit: %+v, %v", rec, err)
	}
}

func (h *harness) middlewareRollback(t *testing.T) {
	f, ctx := h.cfg.New(t), ctxT(t)
	req := h.req("rollback", 12)
	tctx, tx, err := f.Store.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !f.Store.InTx(tctx) {
		t.Fatal("InTx is false for Begin's context")
	}
	if res, err := f.Store.Claim(tctx, req); err != nil || !res.Claimed {
		t.Fatalf("claim: %+v, %v", res, err)
	}
	if err := f.Insert(tctx, "rollback"); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	if n := f.Count(t, "rollback"); n != 0 {
		t.Fatalf("business rows after rollback: %d, want 0", n)
	}
	if _, err := f.Store.Get(ctx, req.ID, h.now); !errors.Is(err, core.ErrNotFound) {
		t.Fatalf("Get after rollback: %v, want ErrNotFound", err)
	}
	req.Token = 13
	if res, err := execute(ctx, f, req, h.completion("rollback")); err != nil || !res.Claimed {
		t.Fatalf("claim after rollback: %+v, %v", res, err)
	}
}

// commitAfterCancel: cancelling the context given to Begin rolls the
// transaction back (database/sql's rule, which sqlstore keeps although
// its transaction runs on a context of its own): a Commit that comes after
// fails with an error matching context.Canceled, and neither the claim
// nor the business row commits.
func (h *harness) commitAfterCancel(t *testing.T) {
	f, ctx := h.cfg.New(t), ctxT(t)
	req := h.req("cancelled", 14)
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	tctx, tx, err := f.Store.Begin(cctx)
	if err != nil {
		t.Fatal(err)
	}
	if res, err := f.Store.Claim(tctx, req); err != nil || !res.Claimed {
		t.Fatalf("claim: %+v, %v", res, err)
	}
	if err := f.Insert(tctx, "cancelled"); err != nil {
		t.Fatal(err)
	}
	cancel()
	if err := tx.Commit(); !errors.Is(err, context.Canceled) {
		t.Fatalf("Commit after the context ended: %v, want an error matching context.Canceled", err)
	}
	if n := f.Count(t, "cancelled"); n != 0 {
		t.Fatalf("business rows after a Commit whose context had ended: %d, want 0", n)
	}
	if _, err := f.Store.Get(ctx, req.ID, h.now); !errors.Is(err, core.ErrNotFound) {
		t.Fatalf("Get after a Commit whose context had ended: %v, want ErrNotFound", err)
	}
}

func (h *harness) callerCommit(t *testing.T) {
	f, ctx := h.cfg.New(t), ctxT(t)
	req := h.req("caller", 21)
	err := f.CallerManaged(ctx, func(ctx context.Context) error {
		if !f.Store.InTx(ctx) {
			return errors.New("InTx is false for the application's transaction")
		}
		res, err := f.Store.Claim(ctx, req)
		if err != nil || !res.Claimed {
			return fmt.Errorf("claim: %+v, %v", res, err)
		}
		if err := f.Insert(ctx, "caller"); err != nil {
			return err
		}
		return f.Store.Complete(ctx, req.ID, req.Token, h.completion("caller"))
	})
	if err != nil {
		t.Fatal(err)
	}
	if n := f.Count(t, "caller"); n != 1 {
		t.Fatalf("business rows: %d, want 1", n)
	}
	// A duplicate in another application transaction replays.
	req.Token = 22
	err = f.CallerManaged(ctx, func(ctx context.Context) error {
		res, err := f.Store.Claim(ctx, req)
		if err != nil || res.Claimed || res.Record.State != store.StateCompleted || res.Record.Status != 201 {
			return fmt.Errorf("duplicate claim: %+v, %v", res, err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func (h *harness) callerRollback(t *testing.T) {
	f, ctx := h.cfg.New(t), ctxT(t)
	req := h.req("caller-rb", 31)
	err := f.CallerManaged(ctx, func(ctx context.Context) error {
		if res, err := f.Store.Claim(ctx, req); err != nil || !res.Claimed {
			return fmt.Errorf("claim: %+v, %v", res, err)
		}
		if err := f.Insert(ctx, "caller-rb"); err != nil {
			return err
		}
		if err := f.Store.Complete(ctx, req.ID, req.Token, h.completion("caller-rb")); err != nil {
			return err
		}
		return errRollback
	})
	if !errors.Is(err, errRollback) {
		t.Fatalf("CallerManaged: %v, want the rollback error", err)
	}
	if n := f.Count(t, "caller-rb"); n != 0 {
		t.Fatalf("business rows after rollback: %d, want 0", n)
	}
	if _, err := f.Store.Get(ctx, req.ID, h.now); !errors.Is(err, core.ErrNotFound) {
		t.Fatalf("Get after rollback: %v, want ErrNotFound", err)
	}
}

// inFlight: transaction A claims and stays open; a duplicate claim in
// another transaction of the same store (atomic mode), and one outside any
// (leased mode), answer in progress without waiting for A: the store's
// registry of its own open transactions answers before the database (see
// twin for the database's own probe).
func (h *harness) inFlight(t *testing.T) {
	f, ctx := h.cfg.New(t), ctxT(t)
	req := h.req("inflight", 41)
	actx, atx, err := f.Store.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = atx.Rollback() }()
	if res, err := f.Store.Claim(actx, req); err != nil || !res.Claimed {
		t.Fatalf("claim A: %+v, %v", res, err)
	}
	if err := f.Insert(actx, "inflight"); err != nil {
		t.Fatal(err)
	}
	dup := req
	dup.Token = 42

	// Several samples each, so the log shows the steady state (the first
	// Begin may open a connection). A is open throughout: a duplicate that
	// waited for it would never return.
	const samples = 10
	var atomicLat, leasedLat []time.Duration
	for range samples {
		start := time.Now()
		bctx, btx, err := f.Store.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		res, err := f.Store.Claim(bctx, dup)
		_ = btx.Rollback()
		atomicLat = append(atomicLat, time.Since(start))
		if err != nil || res.Claimed || res.Record.State != store.StateInProgress || res.Record.ID != req.ID {
			t.Fatalf("atomic duplicate while A is open: %+v, %v", res, err)
		}
		start = time.Now()
		res, err = f.Store.Claim(ctx, dup) // leased mode: no transaction in ctx
		leasedLat = append(leasedLat, time.Since(start))
		if err != nil || res.Claimed || res.Record.State != store.StateInProgress {
			t.Fatalf("leased duplicate while A is open: %+v, %v", res, err)
		}
	}
	if _, err := f.Store.Get(ctx, req.ID, h.now); !errors.Is(err, core.ErrNotFound) {
		t.Fatalf("Get of A's uncommitted record: %v, want ErrNotFound", err)
	}
	t.Logf("%v: in-flight duplicate answered in progress: atomic (Begin+Claim+Rollback) %s; leased (Claim) %s",
		h.cfg.Dialect, spread(atomicLat), spread(leasedLat))

	if err := f.Store.Complete(actx, req.ID, req.Token, h.completion("inflight")); err != nil {
		t.Fatal(err)
	}
	if err := atx.Commit(); err != nil {
		t.Fatal(err)
	}
	bctx, btx, err := f.Store.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	res, err := f.Store.Claim(bctx, dup)
	_ = btx.Rollback()
	if err != nil || res.Claimed || res.Record.State != store.StateCompleted {
		t.Fatalf("duplicate after A committed: %+v, %v", res, err)
	}

	// A rolled-back claim leaves the identity free at once.
	req2 := h.req("inflight-rb", 43)
	actx, atx2, err := f.Store.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if res, err := f.Store.Claim(actx, req2); err != nil || !res.Claimed {
		t.Fatalf("claim A2: %+v, %v", res, err)
	}
	_ = atx2.Rollback()
	req2.Token = 44
	if res, err := execute(ctx, f, req2, h.completion("inflight-rb")); err != nil || !res.Claimed {
		t.Fatalf("claim after A2 rolled back: %+v, %v", res, err)
	}
}

// twin: transaction A of one store claims and stays open; a duplicate
// comes through another store on the same table with its own pool, as
// another process would, so the registry does not know A. Postgres and
// MySQL answer in progress at once (the database's probe).
// SQLite serialises writers and the other store's registry does not know
// A: the duplicate waits for A's transaction (up to busy_timeout), then
// replays what A committed.
func (h *harness) twin(t *testing.T) {
	f, ctx := h.cfg.New(t), ctxT(t)
	if f.Twin == nil {
		t.Skip("no twin store")
	}
	other := f.Twin(t)
	req := h.req("twin", 61)
	actx, atx, err := f.Store.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = atx.Rollback() }()
	if res, err := f.Store.Claim(actx, req); err != nil || !res.Claimed {
		t.Fatalf("claim A: %+v, %v", res, err)
	}
	if err := f.Insert(actx, "twin"); err != nil {
		t.Fatal(err)
	}
	dup := req
	dup.Token = 62
	if h.cfg.Dialect != sqlstore.SQLite {
		// The database's own probe: several samples, so the log shows the
		// steady state (the first one opens a connection).
		const samples = 10
		var atomicLat, leasedLat []time.Duration
		for range samples {
			start := time.Now()
			bctx, btx, err := other.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			res, err := other.Claim(bctx, dup)
			_ = btx.Rollback()
			atomicLat = append(atomicLat, time.Since(start))
			if err != nil || res.Claimed || res.Record.State != store.StateInProgress {
				t.Fatalf("the other store's atomic duplicate while A is open: %+v, %v", res, err)
			}
			start = time.Now()
			res, err = other.Claim(ctx, dup)
			leasedLat = append(leasedLat, time.Since(start))
			if err != nil || res.Claimed || res.Record.State != store.StateInProgress {
				t.Fatalf("the other store's leased duplicate while A is open: %+v, %v", res, err)
			}
		}
		t.Logf("%v: the other store's duplicate answered in progress (the database's probe): atomic (Begin+Claim+Rollback) %s; leased (Claim) %s",
			h.cfg.Dialect, spread(atomicLat), spread(leasedLat))
		return
	}
	type out struct {
		res store.ClaimResult
		err error
		d   time.Duration
	}
	done := make(chan out, 1)
	go func() {
		start := time.Now()
		bctx, btx, err := other.Begin(ctx)
		if err != nil {
			done <- out{err: err}
			return
		}
		res, err := other.Claim(bctx, dup)
		_ = btx.Rollback()
		done <- out{res, err, time.Since(start)}
	}()
	const hold = 300 * time.Millisecond
	time.Sleep(hold) // A's business transaction runs on while the duplicate waits
	select {
	case o := <-done:
		t.Fatalf("the other store's duplicate answered while A is open (%+v, %v): SQLite should make it wait", o.res, o.err)
	default:
	}
	if err := f.Store.Complete(actx, req.ID, req.Token, h.completion("twin")); err != nil {
		t.Fatal(err)
	}
	if err := atx.Commit(); err != nil {
		t.Fatal(err)
	}
	o := <-done
	if o.err != nil || o.res.Claimed || o.res.Record.State != store.StateCompleted {
		t.Fatalf("the other store's duplicate after A committed: %+v, %v", o.res, o.err)
	}
	t.Logf("sqlite: the other store's duplicate waited %v for A's transaction (held open %v), then replayed", o.d.Round(time.Millisecond), hold)
}

func (h *harness) statementCounts(t *testing.T) {
	f, ctx := h.cfg.New(t), ctxT(t)
	if f.Counter == nil {
		t.Skip("no statement counter")
	}
	// A claim before the counted ones: what a store learns of its server
	// once (MySQL: that it has no SET STATEMENT, see insertClaim) is not
	// a cost of every request.
	warmReq := h.req("count-warm", 50)
	wctx, wtx, err := f.Store.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Store.Claim(wctx, warmReq); err != nil {
		t.Fatal(err)
	}
	_ = wtx.Rollback()

	req := h.req("count", 51)
	tctx, tx, err := f.Store.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	before, prepBefore := f.Counter.Statements(), f.Counter.Prepares()
	res, err := f.Store.Claim(tctx, req)
	if err != nil || !res.Claimed {
		t.Fatalf("claim: %+v, %v", res, err)
	}
	if err := f.Store.Complete(tctx, req.ID, req.Token, h.completion("count")); err != nil {
		t.Fatal(err)
	}
	first, firstPrep := f.Counter.Statements()-before, f.Counter.Prepares()-prepBefore
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}

	tctx, tx, err = f.Store.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	before, prepBefore = f.Counter.Statements(), f.Counter.Prepares()
	req.Token = 52
	res, err = f.Store.Claim(tctx, req)
	rep, repPrep := f.Counter.Statements()-before, f.Counter.Prepares()-prepBefore
	_ = tx.Rollback()
	if err != nil || res.Claimed || res.Record.State != store.StateCompleted {
		t.Fatalf("replay claim: %+v, %v", res, err)
	}
	t.Logf("%v: first execution %d statements (claim + complete), replay %d, besides BEGIN and COMMIT/ROLLBACK; the driver also prepared %d and %d statements",
		h.cfg.Dialect, first, rep, firstPrep, repPrep)
	wantFirst, wantRep := firstExecution[h.cfg.Dialect], replay[h.cfg.Dialect]
	mysqlOnly := h.cfg.Dialect == sqlstore.MySQL && !mariaDB(t, f.DB)
	if mysqlOnly {
		// MySQL (not MariaDB) cannot tell the INSERT not to wait for
		// another transaction's row: the claim probes first (probe,
		// insert; a replay is the probe).
		wantFirst, wantRep = wantFirst+1, 1
	}
	if first != wantFirst {
		t.Errorf("first execution: %d statements, documented %d", first, wantFirst)
	}
	if rep != wantRep {
		t.Errorf("replay: %d statements, documented %d", rep, wantRep)
	}

	// The same in the application's transaction (on MySQL/MariaDB the
	// claim inserts first there: read, insert, complete; a replay is the
	// read).
	req = h.req("count-caller", 53)
	var cmFirst, cmRep int64
	err = f.CallerManaged(ctx, func(ctx context.Context) error {
		before := f.Counter.Statements()
		res, err := f.Store.Claim(ctx, req)
		if err != nil || !res.Claimed {
			return fmt.Errorf("claim: %+v, %v", res, err)
		}
		if err := f.Store.Complete(ctx, req.ID, req.Token, h.completion("count-caller")); err != nil {
			return err
		}
		cmFirst = f.Counter.Statements() - before
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	req.Token = 54
	err = f.CallerManaged(ctx, func(ctx context.Context) error {
		before := f.Counter.Statements()
		res, err := f.Store.Claim(ctx, req)
		cmRep = f.Counter.Statements() - before
		if err != nil || res.Claimed || res.Record.State != store.StateCompleted {
			return fmt.Errorf("replay claim: %+v, %v", res, err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%v: caller-managed: first execution %d statements, replay %d", h.cfg.Dialect, cmFirst, cmRep)
	want, wantRep := firstExecution[h.cfg.Dialect], replay[h.cfg.Dialect]
	if h.cfg.Dialect == sqlstore.MySQL {
		// In the application's transaction, at an isolation level the
		// store does not choose, the claim reads first (no locking read
		// before the INSERT, see claimMySQLJoined): read, insert,
		// complete; a replay is the read. MySQL (not MariaDB) also
		// probes, on a connection of its own.
		want, wantRep = want+1, 1
		if mysqlOnly {
			want++
		}
	}
	if cmFirst != want {
		t.Errorf("caller-managed first execution: %d statements, documented %d", cmFirst, want)
	}
	if cmRep != wantRep {
		t.Errorf("caller-managed replay: %d statements, documented %d", cmRep, wantRep)
	}
}

// replayRollback: on Postgres the transaction of a replay (Begin's, whose
// only statement was a claim that answered a completed record: it wrote
// nothing, and a completed record is final, so no lock it may hold can
// keep another claim from an answer) ends off the caller's path: Rollback
// returns while the database's ROLLBACK is held, and the connection goes
// back to the pool once it has run, so a replay costs one round trip
// less. A transaction that claimed, or in which the application ran a
// statement, rolls back on the caller's path: Rollback waits for it.
// Other dialects roll back on the caller's path (MariaDB's failed INSERT
// leaves a shared lock on the row).
func (h *harness) replayRollback(t *testing.T) {
	if h.cfg.Dialect != sqlstore.Postgres {
		t.Skip("Postgres only: other dialects roll a replay back on the caller's path")
	}
	f, ctx := h.cfg.New(t), ctxT(t)
	if f.Counter == nil {
		t.Skip("the fixture's pool is not a database/sql pool it counts (pgxstore: TestRoundTrips holds its rollbacks)")
	}
	req := h.req("rb-replay", 60)
	if res, err := execute(ctx, f, req, h.completion("rb-replay")); err != nil || !res.Claimed {
		t.Fatalf("first execution: %+v, %v", res, err)
	}
	release := f.Counter.HoldRollbacks()
	t.Cleanup(release)
	before := f.Counter.Rollbacks()
	// rollback ends tx in a goroutine and reports whether Rollback
	// returned while the ROLLBACK was held.
	rollback := func(tx store.Tx) (returned bool, done <-chan error) {
		ch := make(chan error, 1)
		go func() { ch <- tx.Rollback() }()
		select {
		case err := <-ch:
			ch <- err
			return true, ch
		case <-time.After(100 * time.Millisecond):
			return false, ch
		}
	}
	begin := func() (context.Context, store.Tx) {
		t.Helper()
		tctx, tx, err := f.Store.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return tctx, tx
	}

	// The replay's context ends as soon as Rollback returns, as a
	// request's does once it is answered (and as the engine's context of
	// the transaction does): that must not cut its ROLLBACK short.
	rctx, cancel := context.WithCancel(ctx)
	tctx, tx, err := f.Store.Begin(rctx)
	if err != nil {
		t.Fatal(err)
	}
	req.Token = 61
	if res, err := f.Store.Claim(tctx, req); err != nil || res.Claimed || res.Record.State != store.StateCompleted {
		t.Fatalf("replay claim: %+v, %v", res, err)
	}
	returned, done := rollback(tx)
	cancel()
	if !returned {
		t.Fatal("a replay's Rollback waited for the database's ROLLBACK: it is on the caller's path")
	}
	if err := <-done; err != nil {
		t.Fatalf("a replay's Rollback: %v", err)
	}
	errs := f.Counter.RollbackErrors()

	tctx, tx = begin()
	if res, err := f.Store.Claim(tctx, h.req("rb-claimed", 62)); err != nil || !res.Claimed {
		t.Fatalf("claim: %+v, %v", res, err)
	}
	claimed, claimedDone := rollback(tx)

	tctx, tx = begin()
	req.Token = 63
	if res, err := f.Store.Claim(tctx, req); err != nil || res.Claimed {
		t.Fatalf("replay claim: %+v, %v", res, err)
	}
	if err := f.Insert(tctx, "rb-written"); err != nil {
		t.Fatal(err)
	}
	written, writtenDone := rollback(tx)
	release()
	if claimed {
		t.Error("the Rollback of a transaction that claimed returned before its ROLLBACK ran")
	}
	if written {
		t.Error("the Rollback of a replay's transaction in which the application wrote returned before its ROLLBACK ran")
	}
	for _, ch := range []<-chan error{claimedDone, writtenDone} {
		if err := <-ch; err != nil {
			t.Errorf("Rollback: %v", err)
		}
	}
	// The replay's ROLLBACK runs, and its connection goes back to the pool.
	deadline := time.Now().Add(failsafe)
	for f.Counter.Rollbacks() < before+3 || (f.DB != nil && f.DB.Stats().InUse > 0) {
		if time.Now().After(deadline) {
			inUse := -1
			if f.DB != nil {
				inUse = f.DB.Stats().InUse
			}
			t.Fatalf("%d of the 3 ROLLBACKs ran, %d connections in use, %v after they were released", f.Counter.Rollbacks()-before, inUse, failsafe)
		}
		time.Sleep(time.Millisecond)
	}
	if n := f.Counter.RollbackErrors() - errs; n != 0 {
		t.Errorf("%d ROLLBACKs failed: the replay's, run off the caller's path, was cut short when its context ended", n)
	}
	if n := f.Count(t, "rb-written"); n != 0 {
		t.Errorf("%d rows of the rolled-back transaction committed", n)
	}
}

// vanishedRow: the claim's INSERT meets the id's row, and before the claim
// reads that row another connection deletes it: a sweep of the expired
// record, or the release by its holder of a leased attempt. The record is
// gone, so nothing is in progress: the claim must claim the id (the store
// claims again, a bounded number of times), in atomic and in leased mode,
// and never answer in progress. The delete lands at that exact point
// through the fixture's statement hook, after the first statement that
// inserts into the table.
//
// SQLite's claim is one upsert (no second statement, no window). On
// MariaDB an atomic claim's INSERT that met the row keeps a shared lock on
// it until the transaction ends, so the sweep skips the row (the claim
// then takes the expired row over) and a release could only wait: the
// release rows run on Postgres.
func (h *harness) vanishedRow(t *testing.T) {
	if h.cfg.Dialect == sqlstore.SQLite {
		t.Skip("SQLite: the claim is one upsert, there is no read after it")
	}
	f, ctx := h.cfg.New(t), ctxT(t)
	after := f.AfterStatement
	if after == nil && f.Counter != nil {
		after = f.Counter.AfterStatement
	}
	if after == nil {
		t.Fatal("the fixture sets neither AfterStatement nor Counter")
	}
	for i, tc := range []struct {
		name            string
		leased, release bool
	}{
		{"atomic, swept", false, false},
		{"leased, swept", true, false},
		{"atomic, released", false, true},
		{"leased, released", true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.release && h.cfg.Dialect != sqlstore.Postgres {
				t.Skip("a release cannot land between MariaDB's INSERT and its read: it waits for the INSERT's lock")
			}
			key := fmt.Sprintf("vanished-%d", i)
			held := h.req(key, int64(100+2*i))
			later := h.now
			if tc.release {
				// A leased attempt holds the id (committed, lease live).
				held.LeaseUntil = h.now.Add(time.Minute)
				if res, err := f.Store.Claim(ctx, held); err != nil || !res.Claimed {
					t.Fatalf("holder's claim: %+v, %v", res, err)
				}
			} else {
				// A completed record that has expired by the claim's now.
				held.ExpiresAt = h.now.Add(time.Minute)
				c := h.completion(key)
				c.ExpiresAt = held.ExpiresAt
				if res, err := execute(ctx, f, held, c); err != nil || !res.Claimed {
					t.Fatalf("first execution: %+v, %v", res, err)
				}
				later = h.now.Add(time.Hour)
			}
			req := held
			req.Token, req.Now, req.ExpiresAt, req.LeaseUntil = held.Token+1, later, later.Add(24*time.Hour), time.Time{}
			if tc.leased {
				req.LeaseUntil = later.Add(time.Minute)
			}

			var (
				fired   bool
				deleted int
				delErr  error
			)
			after(func(query string) {
				if fired || !strings.Contains(query, "INSERT INTO") {
					return
				}
				fired = true
				if tc.release {
					delErr = f.Store.Release(ctx, held.ID, held.Token)
					deleted = 1
				} else {
					deleted, delErr = f.Store.DeleteExpired(ctx, later, 10)
				}
			})
			defer after(nil)
			cctx, tx := ctx, store.Tx(nil)
			if !tc.leased {
				var err error
				if cctx, tx, err = f.Store.Begin(ctx); err != nil {
					t.Fatal(err)
				}
			}
			res, err := f.Store.Claim(cctx, req)
			after(nil)
			if tx != nil {
				if err == nil && res.Claimed {
					err = tx.Commit()
				} else {
					_ = tx.Rollback()
				}
			}
			if delErr != nil {
				t.Fatalf("the delete between the claim's statements: %v", delErr)
			}
			t.Logf("%v: hook fired %v, rows deleted between the statements: %d", h.cfg.Dialect, fired, deleted)
			if h.cfg.Dialect == sqlstore.Postgres && (!fired || deleted != 1) {
				t.Fatalf("the hook fired %v and deleted %d rows, want the row deleted after the INSERT", fired, deleted)
			}
			if err != nil || !res.Claimed {
				t.Fatalf("claim after the row vanished: %+v, %v; want claimed (the record is gone, nothing is in progress)", res, err)
			}
			rec, err := f.Store.Get(ctx, req.ID, later)
			if err != nil || rec.Token != req.Token || rec.State != store.StateInProgress {
				t.Fatalf("record after the claim: %+v, %v; want the claim's", rec, err)
			}
		})
	}
}

// concurrent: duplicates race in middleware-managed mode; exactly one runs
// the business write, every other one sees in progress or the completed
// record, and later duplicates replay.
func (h *harness) concurrent(t *testing.T) {
	f, ctx := h.cfg.New(t), ctxT(t)
	const n = 20
	var (
		wg                      sync.WaitGroup
		mu                      sync.Mutex
		claimed, busy, replayed int
		errs                    []error
	)
	start := make(chan struct{})
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			req := h.req("race", int64(100+i))
			res, err := execute(ctx, f, req, h.completion("race"))
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err != nil:
				errs = append(errs, err)
			case res.Claimed:
				claimed++
			case res.Record.State == store.StateInProgress:
				busy++
			case res.Record.State == store.StateCompleted:
				replayed++
			default:
				errs = append(errs, fmt.Errorf("unexpected record %+v", res.Record))
			}
		}()
	}
	close(start)
	wg.Wait()
	if len(errs) > 0 {
		t.Fatalf("%d errors, first: %v", len(errs), errs[0])
	}
	if claimed != 1 || f.Count(t, "race") != 1 {
		t.Fatalf("claimed %d times, %d business rows; want 1 and 1", claimed, f.Count(t, "race"))
	}
	t.Logf("%v: %d concurrent duplicates: 1 executed, %d in progress, %d replayed", h.cfg.Dialect, n, busy, replayed)
	for i := range 5 {
		res, err := execute(ctx, f, h.req("race", int64(200+i)), h.completion("race"))
		if err != nil || res.Claimed || res.Record.State != store.StateCompleted {
			t.Fatalf("sequential duplicate %d: %+v, %v", i, res, err)
		}
	}
	if c := f.Count(t, "race"); c != 1 {
		t.Fatalf("business rows after sequential duplicates: %d, want 1", c)
	}
}

// spread formats the minimum, median and maximum of ds.
func spread(ds []time.Duration) string {
	s := slices.Clone(ds)
	slices.Sort(s)
	r := func(d time.Duration) time.Duration { return d.Round(100 * time.Nanosecond) }
	return fmt.Sprintf("min %v, median %v, max %v over %d", r(s[0]), r(s[len(s)/2]), r(s[len(s)-1]), len(s))
}

// EachName calls each with the one string column of every row of rows, in
// order, while the cursor is open, and closes rows: the body of a
// Fixture.Stream. It returns the first error of a scan or of each, else
// the cursor's own (rows.Err).
func EachName(rows *sql.Rows, each func(name string) error) error {
	defer rows.Close()
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			return err
		}
		if err := each(name); err != nil {
			return err
		}
	}
	return rows.Err()
}

// mariaDB reports whether the MySQL-dialect server behind db is MariaDB.
func mariaDB(t *testing.T, db *sql.DB) bool {
	t.Helper()
	var v string
	if err := db.QueryRowContext(ctxT(t), `SELECT version()`).Scan(&v); err != nil {
		t.Fatalf("SELECT version(): %v", err)
	}
	return strings.Contains(v, "MariaDB")
}
