package reliability

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/memstore"
	"github.com/idemkit/idem/core/observe"
	"github.com/idemkit/idem/core/store"
)

// Lease edge cases in leased mode, on every store: an attempt that pauses
// past its lease (a GC pause, a stalled VM: simulated with an injected
// clock) while a retry takes the record over.

// leaseStore is a store to run the lease cases on, with the route options
// that put it in leased mode.
type leaseStore struct {
	name  string
	new   func(t *testing.T) store.Store
	route []core.RouteOption
}

func leaseStores() []leaseStore {
	stores := []leaseStore{
		{name: "memstore", new: func(*testing.T) store.Store { return memstore.New() }},
		{name: "memstore atomic view, Leased route", new: func(*testing.T) store.Store { return memstore.New().Atomic() }, route: []core.RouteOption{core.Leased()}},
	}
	for _, d := range sqlDialects {
		stores = append(stores, leaseStore{name: "sqlstore " + d.String() + ", Leased route", route: []core.RouteOption{core.Leased()},
			new: func(t *testing.T) store.Store { return newSQLStore(t, d, openDB(t, d, dsn(t, d)), nil) }})
	}
	for _, d := range sqlDialects {
		stores = append(stores, leaseStore{name: "gormstore " + d.String() + ", Leased route", route: []core.RouteOption{core.Leased()},
			new: func(t *testing.T) store.Store { return newGormStore(t, d, openDB(t, d, dsn(t, d))) }})
	}
	stores = append(stores, leaseStore{name: "redisstore", new: func(t *testing.T) store.Store {
		return newRedisStore(t, redisClient(t, redisAddrs(t, "IDEM_TEST_REDIS_ADDR")[0]))
	}})
	return stores
}

// events records the engine's decisions (WithObserver) and its log
// records (WithLogger).
type events struct {
	mu   sync.Mutex
	evs  []observe.Event
	logs []string
}

func (e *events) observe(_ context.Context, ev observe.Event) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.evs = append(e.evs, ev)
}

func (e *events) find(d observe.Decision) []observe.Event {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []observe.Event
	for _, ev := range e.evs {
		if ev.Decision == d {
			out = append(out, ev)
		}
	}
	return out
}

func (e *events) Enabled(context.Context, slog.Level) bool { return true }
func (e *events) WithAttrs([]slog.Attr) slog.Handler       { return e }
func (e *events) WithGroup(string) slog.Handler            { return e }
func (e *events) Handle(_ context.Context, r slog.Record) error {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s", r.Level, r.Message)
	r.Attrs(func(a slog.Attr) bool {
		fmt.Fprintf(&b, " %s=%v", a.Key, a.Value)
		return true
	})
	e.mu.Lock()
	defer e.mu.Unlock()
	e.logs = append(e.logs, b.String())
	return nil
}

func (e *events) logged(substrs ...string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, l := range e.logs {
		all := true
		for _, s := range substrs {
			all = all && strings.Contains(l, s)
		}
		if all {
			return true
		}
	}
	return false
}

// stalling wraps a store: while stalled, Extend fails as if the attempt's
// process were paused (its heartbeats do not reach the store), so its lease
// lapses on the fake clock however the real-time heartbeat runs.
type stalling struct {
	store.Store
	stalled atomic.Bool
}

func (s *stalling) Extend(ctx context.Context, id store.ID, token int64, until time.Time) error {
	if s.stalled.Load() {
		return fmt.Errorf("%w: the attempt's process is paused", core.ErrStoreUnavailable)
	}
	return s.Store.Extend(ctx, id, token, until)
}

// stallingTx keeps a TxStore a TxStore, so the Leased route option is
// what selects leased mode.
type stallingTx struct {
	*stalling
	tx store.TxStore
}

func (s stallingTx) Begin(ctx context.Context) (context.Context, store.Tx, error) {
	return s.tx.Begin(ctx)
}
func (s stallingTx) InTx(ctx context.Context) bool { return s.tx.InTx(ctx) }
func (s stallingTx) WithoutTx(ctx context.Context) context.Context {
	return s.tx.WithoutTx(ctx)
}

// leaseHarness is one engine over a store with a fake clock, and a
// handler whose runs can be held.
type leaseHarness struct {
	t     *testing.T
	st    *stalling
	clock atomic.Int64 // ns after base
	ev    *events
	h     http.Handler
	runs  atomic.Int32
	mu    sync.Mutex
	hold  map[string]chan struct{} // per "attempt" header: closed to let the handler return
	ctxs  map[string]context.Context
	dkeys map[string]string
	start map[string]chan struct{} // closed when the handler started
}

var leaseBase = time.Date(2032, 3, 4, 5, 6, 7, 0, time.UTC)

func newLeaseHarness(t *testing.T, st store.Store, route []core.RouteOption, opts ...core.Option) *leaseHarness {
	lh := &leaseHarness{t: t, ev: &events{}, hold: map[string]chan struct{}{}, ctxs: map[string]context.Context{},
		dkeys: map[string]string{}, start: map[string]chan struct{}{}}
	opts = append([]core.Option{core.WithSingleCaller(), core.WithClock(lh.now), core.WithObserver(lh.ev.observe),
		core.WithLogger(slog.New(lh.ev))}, opts...)
	lh.st = &stalling{Store: st}
	var wrapped store.Store = lh.st
	if tx, ok := st.(store.TxStore); ok {
		wrapped = stallingTx{lh.st, tx}
	}
	e, err := core.New(wrapped, opts...)
	if err != nil {
		t.Fatal(err)
	}
	route = append([]core.RouteOption{core.Scope("POST /charges")}, route...)
	lh.h = e.Handler(http.HandlerFunc(lh.handle), route...)
	return lh
}

func (lh *leaseHarness) now() time.Time { return leaseBase.Add(time.Duration(lh.clock.Load())) }

func (lh *leaseHarness) advance(d time.Duration) { lh.clock.Add(int64(d)) }

// expect registers attempt name: its handler will wait for release(name).
func (lh *leaseHarness) expect(name string) {
	lh.mu.Lock()
	defer lh.mu.Unlock()
	lh.hold[name] = make(chan struct{})
	lh.start[name] = make(chan struct{})
}

func (lh *leaseHarness) release(name string) { close(lh.hold[name]) }

func (lh *leaseHarness) started(name string) {
	select {
	case <-lh.start[name]:
	case <-time.After(10 * time.Second):
		lh.t.Fatalf("attempt %s never started", name)
	}
}

// handle answers as the "X-Attempt" header says: "status" (201 by
// default) with a body naming the attempt, after waiting for its release.
func (lh *leaseHarness) handle(w http.ResponseWriter, r *http.Request) {
	lh.runs.Add(1)
	name := r.Header.Get("X-Attempt")
	if r.Header.Get("X-Outcome") != "429" {
		// The effect is a charge with a payment provider. A 429 is the
		// provider's rate limit answered before any charge: after
		// MarkEffect it would be indeterminate, never released.
		core.MarkEffect(r.Context())
	}
	lh.mu.Lock()
	lh.ctxs[name] = r.Context()
	lh.dkeys[name], _ = core.DownstreamKey(r.Context(), "charge")
	hold, start := lh.hold[name], lh.start[name]
	lh.mu.Unlock()
	if start != nil {
		close(start)
	}
	if hold != nil {
		<-hold
	}
	status := http.StatusCreated
	switch r.Header.Get("X-Outcome") {
	case "429":
		status = http.StatusTooManyRequests
	case "502":
		status = http.StatusBadGateway
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	fmt.Fprintf(w, `{"charged_by":%q}`, name)
}

// send posts one request of attempt name; outcome selects the handler's
// answer ("", "429", "502").
func (lh *leaseHarness) send(name, outcome string) *httptest.ResponseRecorder {
	r := httptest.NewRequest("POST", "/charges", strings.NewReader(`{"amount":100}`))
	r.Header.Set("Content-Type", "application/json")
	r.Header.Set(core.HeaderKey, "charge-1")
	r.Header.Set("X-Attempt", name)
	r.Header.Set("X-Outcome", outcome)
	w := httptest.NewRecorder()
	lh.h.ServeHTTP(w, r)
	return w
}

// sendAsync runs send in a goroutine; the channel yields the answer.
func (lh *leaseHarness) sendAsync(name, outcome string) <-chan *httptest.ResponseRecorder {
	ch := make(chan *httptest.ResponseRecorder, 1)
	go func() { ch <- lh.send(name, outcome) }()
	return ch
}

func wait(t *testing.T, ch <-chan *httptest.ResponseRecorder) *httptest.ResponseRecorder {
	t.Helper()
	select {
	case w := <-ch:
		return w
	case <-time.After(20 * time.Second):
		t.Fatal("a request never returned")
	}
	return nil
}

func wantAnswer(t *testing.T, w *httptest.ResponseRecorder, status int, by string, replayed bool) {
	t.Helper()
	body := w.Body.String()
	if w.Code != status || (by != "" && body != fmt.Sprintf(`{"charged_by":%q}`, by)) || (w.Header().Get(core.HeaderReplayed) == "true") != replayed {
		t.Fatalf("got %d %s (replayed=%q), want %d by %q (replayed %v)", w.Code, body, w.Header().Get(core.HeaderReplayed), status, by, replayed)
	}
}

func wantLeaseLostProblem(t *testing.T, w *httptest.ResponseRecorder) {
	t.Helper()
	if w.Code != http.StatusConflict || w.Header().Get("Content-Type") != "application/problem+json" ||
		!strings.Contains(w.Body.String(), "lease-lost") || w.Header().Get("Retry-After") == "" {
		t.Fatalf("the stale attempt's client got %d %q %q, want 409 lease-lost with Retry-After", w.Code, w.Header(), w.Body.String())
	}
}

func TestLeaseEdgeCases(t *testing.T) {
	for _, ls := range leaseStores() {
		t.Run(ls.name, func(t *testing.T) {
			for _, tc := range []struct {
				name string
				run  func(t *testing.T, ls leaseStore)
			}{
				{"ok, a paused attempt's completion is refused after a takeover completed; replays serve the new owner", pausedCompletes},
				{"ok, a paused attempt's completion is refused while the takeover still runs; the takeover's answer wins", pausedCompletesFirst},
				{"ok, a paused attempt that fails (502) cannot make the takeover's record indeterminate", pausedFails},
				{"ok, a paused attempt that releases (429) cannot delete the takeover's record", pausedReleases},
				{"ok, a duplicate during a live lease is refused with 409, then takes over once it lapses", liveLeaseRefused},
				{"ok, the heartbeat tells a paused attempt through its context that it lost the lease", heartbeatCancels},
			} {
				t.Run(tc.name, func(t *testing.T) { tc.run(t, ls) })
			}
		})
	}
}

// takeOver pauses attempt A past its lease and lets B take over; B's
// handler is held too when holdB.
func takeOver(t *testing.T, lh *leaseHarness, outcomeA string, holdB bool) (a, b <-chan *httptest.ResponseRecorder) {
	lh.expect("A")
	a = lh.sendAsync("A", outcomeA)
	lh.started("A")
	lh.st.stalled.Store(true)
	lh.advance(core.DefaultLease + time.Second) // A is paused past its lease
	if holdB {
		lh.expect("B")
	}
	b = lh.sendAsync("B", "")
	if holdB {
		lh.started("B")
	}
	return a, b
}

func checkTakeoverEvents(t *testing.T, lh *leaseHarness) {
	t.Helper()
	lost := lh.ev.find(observe.DecisionLeaseLost)
	if len(lost) != 1 || lost[0].Attempt != 1 {
		t.Fatalf("LeaseLost decisions: %+v, want one for attempt 1", lost)
	}
	if !lh.ev.logged("WARN", "lease_lost") {
		t.Fatalf("the lost lease was not logged at warn level; logs: %q", lh.ev.logs)
	}
	if ex := lh.ev.find(observe.DecisionExecuted); len(ex) != 1 || ex[0].Attempt != 2 {
		t.Fatalf("Executed decisions: %+v, want one, the takeover's (attempt 2)", ex)
	}
	if lh.dkeys["A"] == "" || lh.dkeys["A"] != lh.dkeys["B"] {
		t.Fatalf("downstream keys differ between the attempts: %q, %q", lh.dkeys["A"], lh.dkeys["B"])
	}
}

func pausedCompletes(t *testing.T, ls leaseStore) {
	lh := newLeaseHarness(t, ls.new(t), ls.route)
	a, b := takeOver(t, lh, "", false)
	wantAnswer(t, wait(t, b), http.StatusCreated, "B", false)
	lh.release("A")
	wantLeaseLostProblem(t, wait(t, a))
	checkTakeoverEvents(t, lh)
	wantAnswer(t, lh.send("C", ""), http.StatusCreated, "B", true)
	if n := lh.runs.Load(); n != 2 {
		t.Fatalf("%d runs, want 2 (the paused attempt and the takeover)", n)
	}
}

func pausedCompletesFirst(t *testing.T, ls leaseStore) {
	lh := newLeaseHarness(t, ls.new(t), ls.route)
	a, b := takeOver(t, lh, "", true)
	lh.release("A") // A wakes up and finishes while B still runs
	wantLeaseLostProblem(t, wait(t, a))
	if w := lh.send("C", ""); w.Code != http.StatusConflict {
		t.Fatalf("a duplicate while the takeover runs: %d, want 409", w.Code)
	}
	lh.release("B")
	wantAnswer(t, wait(t, b), http.StatusCreated, "B", false)
	checkTakeoverEvents(t, lh)
	wantAnswer(t, lh.send("C", ""), http.StatusCreated, "B", true)
}

func pausedFails(t *testing.T, ls leaseStore) {
	lh := newLeaseHarness(t, ls.new(t), ls.route)
	a, b := takeOver(t, lh, "502", false)
	wantAnswer(t, wait(t, b), http.StatusCreated, "B", false)
	lh.release("A")
	wantLeaseLostProblem(t, wait(t, a))
	checkTakeoverEvents(t, lh)
	if len(lh.ev.find(observe.DecisionIndeterminate)) != 0 {
		t.Fatal("the stale attempt's 502 was recorded as indeterminate")
	}
	wantAnswer(t, lh.send("C", ""), http.StatusCreated, "B", true)
}

func pausedReleases(t *testing.T, ls leaseStore) {
	lh := newLeaseHarness(t, ls.new(t), ls.route)
	a, b := takeOver(t, lh, "429", false)
	wantAnswer(t, wait(t, b), http.StatusCreated, "B", false)
	lh.release("A")
	// A release changes nothing that happened: the handler's 429 is
	// still true and reaches its client, but the record stays B's.
	wantAnswer(t, wait(t, a), http.StatusTooManyRequests, "A", false)
	if lost := lh.ev.find(observe.DecisionLeaseLost); len(lost) != 1 {
		t.Fatalf("LeaseLost decisions: %+v, want one", lost)
	}
	wantAnswer(t, lh.send("C", ""), http.StatusCreated, "B", true)
}

func liveLeaseRefused(t *testing.T, ls leaseStore) {
	lh := newLeaseHarness(t, ls.new(t), ls.route)
	lh.expect("A")
	a := lh.sendAsync("A", "")
	lh.started("A")
	lh.st.stalled.Store(true)
	lh.advance(core.DefaultLease - time.Second) // still within the lease
	if w := lh.send("B", ""); w.Code != http.StatusConflict || w.Header().Get("Retry-After") == "" {
		t.Fatalf("a duplicate within the lease: %d, want 409 with Retry-After", w.Code)
	}
	lh.advance(2 * time.Second) // now past it
	wantAnswer(t, lh.send("B", ""), http.StatusCreated, "B", false)
	lh.release("A")
	wantLeaseLostProblem(t, wait(t, a))
	wantAnswer(t, lh.send("C", ""), http.StatusCreated, "B", true)
}

func heartbeatCancels(t *testing.T, ls leaseStore) {
	// A short lease, so that the heartbeat (every third of it, real time)
	// runs during the test; the fake clock stands still in between, so
	// each heartbeat extends the lease to now+lease.
	const lease = 300 * time.Millisecond
	lh := newLeaseHarness(t, ls.new(t), ls.route, core.WithLease(lease))
	lh.expect("A")
	a := lh.sendAsync("A", "")
	lh.started("A")
	lh.st.stalled.Store(true) // A's process stalls: its heartbeats fail
	lh.advance(time.Hour)
	wantAnswer(t, lh.send("B", ""), http.StatusCreated, "B", false)
	lh.st.stalled.Store(false) // A's process resumes: its next heartbeat is fenced
	lh.mu.Lock()
	ctx := lh.ctxs["A"]
	lh.mu.Unlock()
	select {
	case <-ctx.Done():
		if !errors.Is(context.Cause(ctx), core.ErrLeaseLost) {
			t.Fatalf("A's context ended with %v, want ErrLeaseLost", context.Cause(ctx))
		}
	case <-time.After(10 * time.Second):
		t.Fatal("A's context was not cancelled after its lease was taken over")
	}
	lh.release("A")
	wantLeaseLostProblem(t, wait(t, a))
	wantAnswer(t, lh.send("C", ""), http.StatusCreated, "B", true)
}
