package sqlstoretest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/store"
	"github.com/idemkit/idem/sqlstore"
)

// The failure paths of atomic mode (issue 13, items 4, 5 and 10), run by
// RunAtomic.

// quietEngine is an engine on f's store that logs warnings only.
func quietEngine(t *testing.T, f Fixture) *core.Engine {
	t.Helper()
	quiet := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	e, err := core.New(f.Store, core.WithSingleCaller(), core.WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// failedStatement: a handler in middleware-managed atomic mode writes a
// business row, then runs a statement that fails in the shared
// transaction (a unique violation) and answers 409. The client gets the
// 409, its retry gets the 409 replayed, and the handler ran once, on every
// database. Postgres aborts the transaction at the failed statement, so
// the engine records the answer in a transaction of its own and none of
// the handler's writes commit; MySQL/MariaDB and SQLite undo the failed
// statement only, and the handler's earlier writes commit with the
// record (as they would without idem).
func (h *harness) failedStatement(t *testing.T) {
	f, ctx := h.cfg.New(t), ctxT(t)
	if f.Unique == nil {
		t.Fatal("the fixture has no Unique")
	}
	e := quietEngine(t, f)
	var runs atomic.Int64
	mux := http.NewServeMux()
	mux.Handle("POST /orders", e.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		ctx := r.Context()
		if err := f.Insert(ctx, "failed-statement"); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		if err := f.Unique(ctx, "failed-statement"); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		if err := f.Unique(ctx, "failed-statement"); err == nil {
			http.Error(w, "the second row of one name did not fail", http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		if r.URL.Query().Get("fail") != "" {
			w.WriteHeader(http.StatusInternalServerError)
			fmt.Fprint(w, `{"error":"database"}`)
			return
		}
		w.WriteHeader(http.StatusConflict)
		fmt.Fprint(w, `{"error":"already exists"}`)
	})))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	client := srv.Client()
	key := "failed-statement-" + Table()

	first := post(ctx, client, srv.URL+"/orders", key, `{}`)
	if first.err != nil || first.status != http.StatusConflict || first.replayed || string(first.body) != `{"error":"already exists"}` {
		t.Fatalf("first request: %v, want the handler's 409", first)
	}
	for i := range 2 {
		again := post(ctx, client, srv.URL+"/orders", key, `{}`)
		if again.err != nil || again.status != http.StatusConflict || !again.replayed || string(again.body) != string(first.body) {
			t.Fatalf("retry %d: %v, want the 409 replayed", i, again)
		}
	}
	if n := runs.Load(); n != 1 {
		t.Fatalf("the handler ran %d times, want 1", n)
	}
	// A 5xx after the failed statement releases the key, as any 5xx in
	// atomic mode without an effect: the retry runs the handler again.
	for i := range 2 {
		a := post(ctx, client, srv.URL+"/orders?fail=1", key+"-5xx", `{}`)
		if a.err != nil || a.status != http.StatusInternalServerError || a.replayed {
			t.Fatalf("5xx request %d: %v, want the handler's 500", i, a)
		}
	}
	if n := runs.Load(); n != 3 {
		t.Fatalf("the handler ran %d times, want 3 (the 5xx released the key)", n)
	}
	want := 1 // the statement failed alone; the row before it commits with the 409 (the 5xx rolled back)
	if h.cfg.Dialect == sqlstore.Postgres {
		want = 0 // the transaction was aborted: nothing of the handler's commits
	}
	if n := f.Count(t, "failed-statement"); n != want {
		t.Fatalf("%v: %d business rows written before the failed statement committed, want %d", h.cfg.Dialect, n, want)
	}
}

// failedStatementCallerManaged: in the application's own transaction the
// engine cannot roll back. After a statement that aborted the transaction
// (Postgres), Once returns core.ErrTxAborted so the caller rolls back; on
// MySQL/MariaDB and SQLite the transaction goes on and Once records the
// value.
func (h *harness) failedStatementCallerManaged(t *testing.T) {
	f, ctx := h.cfg.New(t), ctxT(t)
	e := quietEngine(t, f)
	var onceErr error
	err := f.CallerManaged(ctx, func(ctx context.Context) error {
		_, onceErr = e.Once(ctx, core.Message{Consumer: "orders", ID: "failed-statement"}, func(ctx context.Context) ([]byte, error) {
			if err := f.Unique(ctx, "cm"); err != nil {
				return nil, err
			}
			if err := f.Unique(ctx, "cm"); err == nil {
				return nil, errors.New("the second row of one name did not fail")
			}
			return []byte("duplicate"), nil
		})
		return onceErr
	})
	if h.cfg.Dialect == sqlstore.Postgres {
		if !errors.Is(onceErr, core.ErrTxAborted) || errors.Is(onceErr, core.ErrStoreUnavailable) {
			t.Fatalf("Once after a failed statement in the caller's transaction: %v, want core.ErrTxAborted (and not ErrStoreUnavailable)", onceErr)
		}
		return
	}
	if err != nil {
		t.Fatalf("%v: Once after a failed statement in the caller's transaction: %v, want the value recorded", h.cfg.Dialect, err)
	}
}

// blockedClaim: another transaction holds what the first request's claim
// needs (SQLite: the write lock, by an unrelated write held open;
// Postgres and MySQL: the pool's only connection). Four concurrent
// requests of one new key: the three duplicates answer 409 while the
// first one's claim still waits, each without a turn at the database; the
// first one claims once the holder lets go, and gets its 201. Ordering,
// not latency, is asserted: the 409s arrived before the holder let go.
func (h *harness) blockedClaim(t *testing.T) {
	f, ctx := h.cfg.New(t), ctxT(t)
	srv := newOrderServer(t, f, false)
	var release func()
	if h.cfg.Dialect == sqlstore.SQLite {
		conn, err := f.DB.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		tx, err := conn.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.ExecContext(ctx, "CREATE TABLE "+Table()+" (x INTEGER)"); err != nil { // a write: holds the write lock
			t.Fatal(err)
		}
		release = func() { _ = tx.Rollback() }
	} else if f.Hold != nil {
		release = f.Hold(t)
	} else {
		f.DB.SetMaxOpenConns(1)
		tx, err := f.DB.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.ExecContext(ctx, "SELECT 1"); err != nil {
			t.Fatal(err)
		}
		release = func() { _ = tx.Rollback() }
	}
	defer release() // idempotent: Rollback after Rollback is ErrTxDone

	const n = 4
	type timed struct {
		answer
		at time.Time
	}
	answers := make(chan timed, n)
	key, body := "blocked-"+Table(), orderBody("blocked", 0)
	for range n {
		go func() {
			a := post(ctx, srv.client, srv.URL+"/orders", key, body)
			answers <- timed{a, time.Now()}
		}()
	}
	// The holder lets go once three answered, or after 2 s (less than
	// SQLite's busy_timeout of 5 s, so the first claim does not give up).
	var got []timed
	hold := time.NewTimer(2 * time.Second)
	defer hold.Stop()
wait:
	for len(got) < n-1 {
		select {
		case a := <-answers:
			got = append(got, a)
		case <-hold.C:
			break wait
		}
	}
	released := time.Now()
	release()
	for len(got) < n {
		got = append(got, <-answers)
	}
	slices.SortFunc(got, func(a, b timed) int { return a.at.Compare(b.at) })
	var created, conflicts int
	for i, a := range got {
		switch {
		case a.err != nil:
			t.Errorf("answer %d: %v", i, a.err)
		case a.status == http.StatusConflict:
			conflicts++
			if a.at.After(released) {
				t.Errorf("answer %d: 409 after %v, once the holder had let go: it waited for the first claim", i, a.latency.Round(time.Millisecond))
			}
		case a.status == http.StatusCreated && !a.replayed:
			created++
			if a.at.Before(released) {
				t.Errorf("answer %d: 201 before the holder let go", i)
			}
		default:
			t.Errorf("answer %d: %v, want 409 or the first 201", i, a)
		}
	}
	if created != 1 || conflicts != n-1 {
		t.Fatalf("%d created, %d conflicts; want 1 and %d", created, conflicts, n-1)
	}
	if c := f.Count(t, "blocked"); c != 1 {
		t.Fatalf("%d business rows, want 1", c)
	}
	lat := make([]time.Duration, 0, n-1)
	for _, a := range got[:n-1] {
		lat = append(lat, a.latency)
	}
	t.Logf("%v: duplicates of a claim that waits for the database answered 409: %s", h.cfg.Dialect, spread(lat))
}

// slowReplay: retries of a completed request arrive together while the
// claim statement of the first of them is slow: SQLite's waits for the
// write lock, which an unrelated write holds; Postgres's for a LOCK TABLE
// ... IN EXCLUSIVE MODE, which plain reads pass; MySQL/MariaDB's claim of
// a completed record waits for no lock (a NOWAIT probe, then a plain
// read), so its BEGIN is held in the driver, as a busy machine delays it.
// The retries queue behind that statement in the store's registry of
// in-flight ids longer than it waits (50 ms), and every one gets the
// replay, never in progress: a slow statement does not turn a completed
// request into a 409. Ordering, not latency, is asserted: the queued
// retries answered before the holder let go.
func (h *harness) slowReplay(t *testing.T) {
	f, ctx := h.cfg.New(t), ctxT(t)
	first, done := h.req("slow-replay", 1), h.completion("slow-replay")
	if res, err := execute(ctx, f, first, done); err != nil || !res.Claimed {
		t.Fatalf("first execution: %+v, %v", res, err)
	}
	release := stallClaims(t, f, h.cfg.Dialect)
	defer release()

	const n = 8
	type timed struct {
		res store.ClaimResult
		err error
		at  time.Time
	}
	answers := make(chan timed, n)
	for i := range n {
		go func() {
			tctx, tx, err := f.Store.Begin(ctx)
			if err != nil {
				answers <- timed{err: err, at: time.Now()}
				return
			}
			defer func() { _ = tx.Rollback() }()
			res, err := f.Store.Claim(tctx, h.req("slow-replay", int64(i+2)))
			answers <- timed{res, err, time.Now()}
		}()
	}
	// The holder lets go once all but the first claim answered, or after
	// 2 s (less than SQLite's busy_timeout of 5 s).
	var got []timed
	hold := time.NewTimer(2 * time.Second)
	defer hold.Stop()
wait:
	for len(got) < n-1 {
		select {
		case a := <-answers:
			got = append(got, a)
		case <-hold.C:
			break wait
		}
	}
	released := time.Now()
	release()
	for len(got) < n {
		got = append(got, <-answers)
	}
	early := 0
	for i, a := range got {
		switch {
		case a.err != nil:
			t.Errorf("claim %d: %v", i, a.err)
		case a.res.Claimed || a.res.Record.State != store.StateCompleted || string(a.res.Record.Response) != string(done.Response):
			t.Errorf("claim %d: %+v; want the completed record", i, a.res)
		}
		if a.at.Before(released) {
			early++
		}
	}
	if early < n-1 {
		t.Errorf("%d of %d claims answered while the first claim statement waited, want %d: they waited for it", early, n, n-1)
	}
}

// stallClaims makes the claim statements of f's store wait until release
// while plain reads of its table go on (see slowReplay).
func stallClaims(t *testing.T, f Fixture, d sqlstore.Dialect) (release func()) {
	t.Helper()
	switch d {
	case sqlstore.SQLite:
		return holdTx(t, f, "CREATE TABLE "+Table()+" (x INTEGER)") // a write: holds the write lock
	case sqlstore.Postgres:
		table := f.Store.(interface{ Table() string }).Table()
		return holdTx(t, f, "LOCK TABLE "+table+" IN EXCLUSIVE MODE")
	}
	if f.Counter == nil {
		t.Fatal("the fixture has no Counter")
	}
	return f.Counter.HoldBegins()
}

// holdTx runs stmt in a transaction of its own on f's database and keeps
// it open until release (Fixture.HoldTx, else on DB).
func holdTx(t *testing.T, f Fixture, stmt string) (release func()) {
	t.Helper()
	if f.HoldTx != nil {
		return f.HoldTx(t, stmt)
	}
	ctx := ctxT(t)
	conn, err := f.DB.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	tx, err := conn.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.ExecContext(ctx, stmt); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	release = func() {
		once.Do(func() {
			_ = tx.Rollback()
			_ = conn.Close()
		})
	}
	t.Cleanup(release)
	return release
}

// callerConcurrent: a service opens its own transaction at the
// database's default isolation (REPEATABLE READ on MySQL/MariaDB: db.BeginTx
// with nil options, or GORM's db.Transaction), puts it in the context and
// calls Once; 40 such calls with distinct ids run at once. Every one
// commits its business row (no deadlock, no store error); a second round
// replays every one.
func (h *harness) callerConcurrent(t *testing.T) {
	f, ctx := h.cfg.New(t), ctxT(t)
	e := quietEngine(t, f)
	const n = 40
	var runs atomic.Int64
	round := func() (replayed int, errs []error) {
		var (
			wg sync.WaitGroup
			mu sync.Mutex
		)
		gate := make(chan struct{})
		for i := range n {
			wg.Go(func() {
				<-gate
				name := fmt.Sprintf("caller-%d", i)
				var res core.Result
				err := f.CallerManaged(ctx, func(ctx context.Context) error {
					var err error
					res, err = e.Once(ctx, core.Message{Consumer: "orders", ID: name}, func(ctx context.Context) ([]byte, error) {
						runs.Add(1)
						return []byte(name), f.Insert(ctx, name)
					})
					return err
				})
				mu.Lock()
				defer mu.Unlock()
				switch {
				case err != nil:
					errs = append(errs, fmt.Errorf("%s: %w", name, err))
				case string(res.Value) != name:
					errs = append(errs, fmt.Errorf("%s: value %q", name, res.Value))
				case res.Replayed:
					replayed++
				}
			})
		}
		close(gate)
		wg.Wait()
		return replayed, errs
	}
	if replayed, errs := round(); len(errs) > 0 || replayed != 0 {
		t.Fatalf("%v: %d of %d concurrent caller-managed calls with distinct ids failed (%d replayed), first: %v", h.cfg.Dialect, len(errs), n, replayed, errors.Join(errs...))
	}
	if replayed, errs := round(); len(errs) > 0 || replayed != n {
		t.Fatalf("second round: %d errors, %d replayed, want 0 and %d: %v", len(errs), replayed, n, errors.Join(errs...))
	}
	if r := runs.Load(); r != n {
		t.Fatalf("%d runs, want %d", r, n)
	}
	for i := range n {
		if c := f.Count(t, fmt.Sprintf("caller-%d", i)); c != 1 {
			t.Fatalf("caller-%d: %d business rows, want 1", i, c)
		}
	}
}

// callerInFlight: a claim in the application's transaction A is open; a
// duplicate in another application transaction B (which the store's
// registry does not know: it does not see A end) answers in progress at
// once, on Postgres (the advisory lock) as on MySQL/MariaDB, whose claims
// in the caller's transaction insert first (no gap lock, so no deadlock
// at REPEATABLE READ) and must not wait in that INSERT for A (InnoDB's
// duplicate-key check would, up to innodb_lock_wait_timeout, holding B's
// connection). Once A committed, a claim in a third transaction C gets
// A's completed record. SQLite's B waits for A's write lock (its one
// writer), then replays.
func (h *harness) callerInFlight(t *testing.T) {
	f, ctx := h.cfg.New(t), ctxT(t)
	req := h.req("caller-inflight", 71)
	claimed, finish := make(chan struct{}, 1), make(chan struct{})
	errA := make(chan error, 1)
	endA := sync.OnceFunc(func() { close(finish) })
	t.Cleanup(endA) // before the fixture's cleanups, whose DROP would wait for A
	go func() {
		errA <- f.CallerManaged(ctx, func(ctx context.Context) error {
			res, err := f.Store.Claim(ctx, req)
			if err != nil || !res.Claimed {
				return fmt.Errorf("claim A: %+v, %v", res, err)
			}
			claimed <- struct{}{}
			<-finish
			return f.Store.Complete(ctx, req.ID, req.Token, h.completion("caller-inflight"))
		})
	}()
	select {
	case <-claimed:
	case err := <-errA: // A's transaction did not begin, or its claim failed
		t.Fatalf("%v: A: %v", h.cfg.Dialect, err)
	}
	type out struct {
		res     store.ClaimResult
		err     error
		latency time.Duration
	}
	claimIn := func(token int64) <-chan out {
		ch := make(chan out, 1)
		go func() {
			dup := req
			dup.Token = token
			var o out
			_ = f.CallerManaged(ctx, func(ctx context.Context) error {
				start := time.Now() // the claim's own time: BEGIN and the pool's connection are not the claim's
				o.res, o.err = f.Store.Claim(ctx, dup)
				o.latency = time.Since(start)
				return errRollback
			})
			ch <- o
		}()
		return ch
	}
	outB := claimIn(72)
	if h.cfg.Dialect == sqlstore.SQLite {
		const hold = 300 * time.Millisecond
		time.Sleep(hold) // A runs on while B waits
		select {
		case o := <-outB:
			t.Fatalf("%v: B answered while A is open (%+v, %v): it should wait for A", h.cfg.Dialect, o.res, o.err)
		default:
		}
		endA()
		if err := <-errA; err != nil {
			t.Fatal(err)
		}
		o := <-outB
		if o.err != nil || o.res.Claimed || o.res.Record.State != store.StateCompleted {
			t.Fatalf("B after A committed: %+v, %v; want the completed record", o.res, o.err)
		}
		return
	}
	var o out
	select {
	case o = <-outB:
	case <-time.After(failsafe):
		endA()
		t.Fatalf("%v: B did not answer while A is open", h.cfg.Dialect)
	}
	endA()
	if o.err != nil || o.res.Claimed || o.res.Record.State != store.StateInProgress {
		t.Errorf("%v: B while A is open: %+v, %v; want in progress", h.cfg.Dialect, o.res, o.err)
	}
	if o.latency > inFlightBound {
		t.Errorf("%v: B answered after %v, want at once (under %v): it waited for A", h.cfg.Dialect, o.latency, inFlightBound)
	}
	if err := <-errA; err != nil {
		t.Fatal(err)
	}
	if c := <-claimIn(73); c.err != nil || c.res.Claimed || c.res.Record.State != store.StateCompleted {
		t.Errorf("C after A committed: %+v, %v; want the completed record", c.res, c.err)
	}
}
