package sqlstoretest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime/pprof"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/store"
)

// RunCompleter runs the completer's race on cfg's stores: an indeterminate
// payment (the handler marked the charge and answered 502) meets, at the
// same moment, the completers of two replicas (engines on different
// fixtures: the nodes of a cluster; on one database, the fixture's store
// and its Twin, another pool) and a client's retry on the second replica.
// Every settler asks the same resolver, which learns that the provider
// charged and, in the resolver's transaction, writes the missing payment
// row (Fixture.Insert) before the engine records its answer. Exactly one
// settler commits: one payment row, the handler never runs again, the
// client gets the recorded 502 or the resolved 201, and every later retry
// the 201. It runs leased and atomic routes, each for several rounds.
func RunCompleter(t *testing.T, cfg ClusterConfig) {
	for _, leased := range []bool{true, false} {
		t.Run(map[bool]string{true: "leased", false: "atomic"}[leased], func(t *testing.T) {
			fs := cfg.New(t)
			stores := make([]store.TxStore, 0, 2)
			fixtures := make([]Fixture, 0, 2)
			for _, f := range fs {
				stores, fixtures = append(stores, f.Store), append(fixtures, f)
			}
			if len(stores) == 1 {
				stores, fixtures = append(stores, fs[0].Twin(t)), append(fixtures, fs[0])
			}
			completerRace(t, stores[:2], fixtures[:2], leased)
		})
	}
	t.Run("atomic, a panic after MarkEffect leaves a marked record", func(t *testing.T) {
		abortedMark(t, cfg.New(t)[0].Store)
	})
}

// abortedMark: in atomic mode a handler that marked an effect and then
// panicked has its transaction (the claim and its mark) rolled back, and
// the engine records the indeterminate outcome in a transaction of its
// own. That record must carry the route's mark too, or the completer,
// which exists for exactly such records, never finds it.
func abortedMark(t *testing.T, s store.TxStore) {
	clock := &completerClock{now: time.Now().UTC().Truncate(time.Millisecond)}
	quiet := core.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil)))
	e, err := core.New(s, core.WithSingleCaller(), quiet, core.WithClock(clock.Now))
	if err != nil {
		t.Fatal(err)
	}
	resolver := core.WithResolver(func(context.Context, store.Record) (core.Resolution, error) { return core.Resolution{}, nil })
	var id store.ID
	h := e.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		a, ok := core.AttemptFrom(r.Context())
		if !ok || !a.Atomic {
			t.Errorf("AttemptFrom: %+v, %v; want an atomic attempt", a, ok)
		}
		id = a.ID
		if err := core.MarkEffect(r.Context()); err != nil {
			t.Error(err)
		}
		panic("after the charge")
	}), core.Name("payments"), core.RecordRequest(nil), resolver)
	key := fmt.Sprintf("aborted-mark-%d", clock.Now().UnixNano())
	func() {
		defer func() { _ = recover() }()
		r := httptest.NewRequest(http.MethodPost, "/payments", strings.NewReader("1"))
		r.Header.Set("Idempotency-Key", key)
		h.ServeHTTP(httptest.NewRecorder(), r)
	}()
	rec, err := s.Get(t.Context(), id, clock.Now())
	if err != nil || rec.State != store.StateIndeterminate {
		t.Fatalf("after a panic past MarkEffect: %+v, %v; want an indeterminate record", rec, err)
	}
	clock.add(time.Hour)
	due, err := s.(store.Settler).Due(t.Context(), clock.Now(), store.MaxListLimit)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range due {
		if p.Record.ID == id {
			if p.Mark.Route != "payments" || len(p.Mark.Request) == 0 {
				t.Errorf("the record's mark: route %q, %d bytes of request; want payments and the recorded request", p.Mark.Route, len(p.Mark.Request))
			}
			return
		}
	}
	t.Fatalf("the indeterminate record %s of the named route is not due an hour later: it has no mark, so the completer never settles it", id)
}

// completerClock is the replicas' shared clock, moved by the test.
type completerClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *completerClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *completerClock) add(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// replica is one service of the race: an engine, its payment route and
// its completer.
type replica struct {
	e   *core.Engine
	mux http.Handler
	c   *core.Completer
}

func completerRace(t *testing.T, stores []store.TxStore, fixtures []Fixture, leased bool) {
	const rounds = 6
	clock := &completerClock{now: time.Now().UTC().Truncate(time.Millisecond)}
	var ran atomic.Int32
	charged := map[string]bool{} // downstream keys the provider charged
	var mu sync.Mutex
	quiet := core.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil)))
	reps := make([]*replica, len(stores))
	for i, s := range stores {
		f := fixtures[i]
		e, err := core.New(s, core.WithSingleCaller(), quiet, core.WithClock(clock.Now))
		if err != nil {
			t.Fatal(err)
		}
		resolver := core.WithResolver(func(ctx context.Context, rec store.Record) (core.Resolution, error) {
			req, ok := core.ResolvingRequest(ctx)
			if !ok {
				return core.Resolution{}, fmt.Errorf("no recorded request")
			}
			mu.Lock()
			ok = charged[rec.ID.DownstreamKey("charge")]
			mu.Unlock()
			if !ok {
				return core.Resolution{}, nil
			}
			// The provider charged: record the payment with the answer.
			if err := f.Insert(ctx, "payment-"+string(req.Body)); err != nil {
				return core.Resolution{}, err
			}
			return core.Resolution{Outcome: core.OutcomeApplied, Response: &core.Response{Status: http.StatusCreated,
				Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(`{"paid":"` + string(req.Body) + `"}`)}}, nil
		})
		opts := []core.RouteOption{core.Name("payments"), core.RecordRequest(nil), resolver}
		if leased {
			opts = append(opts, core.Leased())
		}
		h := e.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			ran.Add(1)
			key, err := core.DownstreamKey(r.Context(), "charge")
			if err == nil {
				err = core.MarkEffect(r.Context())
			}
			if err != nil {
				t.Error(err)
			}
			mu.Lock()
			charged[key] = true // the provider charged, but its answer was lost
			mu.Unlock()
			w.WriteHeader(http.StatusBadGateway)
		}), opts...)
		c := e.Completer()
		if err := c.Check(); err != nil {
			t.Fatal(err)
		}
		reps[i] = &replica{e: e, mux: h, c: c}
	}
	for round := range rounds {
		ran.Store(0)
		key := fmt.Sprintf("completer-%d-%s", round, Table())
		body := key
		if w := pay(reps[0], key, body); w.Code != http.StatusBadGateway {
			t.Fatalf("round %d: first attempt %d %s, want 502 (indeterminate)", round, w.Code, w.Body)
		}
		clock.add(2 * core.DefaultLease)
		results, retry := raceSettlers(t, round, reps, key, body)
		if retry.Code != http.StatusCreated && retry.Code != http.StatusBadGateway {
			t.Errorf("round %d: the racing retry got %d %s, want the recorded 502 or the resolved 201", round, retry.Code, retry.Body)
		}
		for i, rp := range reps {
			if w := pay(rp, key, body); w.Code != http.StatusCreated || w.Body.String() != `{"paid":"`+body+`"}` {
				t.Errorf("round %d: a later retry on replica %d: %d %s, want the resolved 201", round, i, w.Code, w.Body)
			}
		}
		if n := fixtures[0].Count(t, "payment-"+body); n != 1 {
			t.Errorf("round %d: %d payment rows (completers: %+v, %+v), want exactly one settler's", round, n, results[0], results[1])
		}
		if n := ran.Load(); n != 1 {
			t.Errorf("round %d: the handler ran %d times, want once", round, n)
		}
	}
}

// RunFinisher runs the finisher's race on cfg's stores: a payment whose
// first attempt marked the charge but failed before the provider took it
// (502: indeterminate) meets, at the same moment, the completers of two
// replicas whose route runs the recorded request again (core.Finish) when
// the resolver answers that nothing was charged, and a client's retry on
// the second replica, which runs the handler again for the same answer.
// Exactly one of them charges (by the first attempt's downstream key), and
// every later retry gets that one's 201. It runs leased and atomic routes,
// and leased routes of engines that do not take lapsed leases over
// (core.WithoutTakeover), each for several rounds. On the leased routes
// it then crashes a first attempt right after its claim (the claim
// commits, and nothing else of that attempt reaches the database: no
// completion, no heartbeat) and shows that the replicas' completers,
// with no client, finish it once: the claim wrote the record's mark
// itself (store.ClaimRequest.Mark); every other such round, a client's
// retry races them.
func RunFinisher(t *testing.T, cfg ClusterConfig) {
	runFinisher(t, cfg, finisherLeased, finisherAtomic, finisherWithoutTakeover)
}

// RunFinisherLeased is RunFinisher on leased routes only.
func RunFinisherLeased(t *testing.T, cfg ClusterConfig) {
	runFinisher(t, cfg, finisherLeased, finisherWithoutTakeover)
}

// RunFinisherAtomic is RunFinisher on an atomic route only.
func RunFinisherAtomic(t *testing.T, cfg ClusterConfig) { runFinisher(t, cfg, finisherAtomic) }

// finisherMode is how a finisher's route runs.
type finisherMode struct {
	name            string
	leased          bool
	withoutTakeover bool // the engines' core.WithoutTakeover
}

var (
	finisherLeased          = finisherMode{name: "leased", leased: true}
	finisherAtomic          = finisherMode{name: "atomic"}
	finisherWithoutTakeover = finisherMode{name: "leased-without-takeover", leased: true, withoutTakeover: true}
)

func runFinisher(t *testing.T, cfg ClusterConfig, modes ...finisherMode) {
	for _, mode := range modes {
		t.Run(mode.name, func(t *testing.T) {
			fs := cfg.New(t)
			stores := make([]store.TxStore, 0, 2)
			for _, f := range fs {
				stores = append(stores, f.Store)
			}
			if len(stores) == 1 {
				stores = append(stores, fs[0].Twin(t))
			}
			finisherRace(t, stores[:2], mode, finisherRun{})
			if mode.leased {
				t.Run("crash-after-claim", func(t *testing.T) { finisherRace(t, stores[:2], mode, finisherRun{crash: true}) })
			}
			t.Run("parallel", func(t *testing.T) { finisherRace(t, stores[:2], mode, finisherRun{parallel: 4}) })
		})
	}
}

// errCrashed is the claim's answer that never arrived.
var errCrashed = errors.New("sqlstoretest: the process died right after its claim committed")

// crashAfterClaim is a store whose next claim that claims (crash set)
// is the last thing its attempt does: the claim commits in the database,
// and its answer never reaches the engine, which therefore writes
// nothing more for it (no mark of its own, no completion, no
// heartbeat), as if its process had died right after the claim.
type crashAfterClaim struct {
	store.TxStore
	set   store.Settler
	crash atomic.Bool
}

func (s *crashAfterClaim) Claim(ctx context.Context, req store.ClaimRequest) (store.ClaimResult, error) {
	res, err := s.TxStore.Claim(ctx, req)
	if err == nil && res.Claimed && s.crash.CompareAndSwap(true, false) {
		return store.ClaimResult{}, errCrashed
	}
	return res, err
}

func (s *crashAfterClaim) Mark(ctx context.Context, id store.ID, token int64, m store.Mark) error {
	return s.set.Mark(ctx, id, token, m)
}

func (s *crashAfterClaim) Due(ctx context.Context, now time.Time, limit int) ([]store.Pending, error) {
	return s.set.Due(ctx, now, limit)
}

func (s *crashAfterClaim) Visit(ctx context.Context, id store.ID, token int64, seen, next time.Time, tries int) (bool, error) {
	return s.set.Visit(ctx, id, token, seen, next, tries)
}

// finisherRun says what finisherRace does in its rounds.
type finisherRun struct {
	// crash: each round's first attempt dies right after its claim on
	// the first replica, and the replicas' completers race to settle it
	// (every other round with a client's retry).
	crash bool
	// parallel, when not zero, replaces the rounds with one batch: the
	// first attempts of several payments fail, and the replicas'
	// completers, visiting parallel records at once
	// (core.Completer.Parallel), race to finish them all, no client.
	parallel int
}

// finisherRace runs the rounds of the finisher's race in mode, as run
// says.
func finisherRace(t *testing.T, stores []store.TxStore, mode finisherMode, run finisherRun) {
	crash := run.crash
	const rounds = 6
	clock := &completerClock{now: time.Now().UTC().Truncate(time.Millisecond)}
	var (
		mu      sync.Mutex
		charges = map[string]int{} // charges the provider took, by downstream key
		runs    atomic.Int32       // handler and finisher executions
		first   atomic.Bool        // the next execution fails before the charge
	)
	quiet := core.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil)))
	charge := func(ctx context.Context, body string) *core.Response {
		runs.Add(1)
		key, err := core.DownstreamKey(ctx, "charge")
		if err == nil {
			err = core.MarkEffect(ctx)
		}
		if err != nil {
			t.Error(err)
			return &core.Response{Status: http.StatusInternalServerError}
		}
		if first.CompareAndSwap(true, false) {
			return &core.Response{Status: http.StatusBadGateway} // the provider never got it
		}
		mu.Lock()
		charges[key]++
		mu.Unlock()
		return &core.Response{Status: http.StatusCreated, Header: http.Header{"Content-Type": {"application/json"}},
			Body: []byte(`{"paid":"` + body + `"}`)}
	}
	reps := make([]*replica, len(stores))
	var crasher *crashAfterClaim
	for i, s := range stores {
		opts := []core.Option{core.WithSingleCaller(), quiet, core.WithClock(clock.Now)}
		if mode.withoutTakeover {
			opts = append(opts, core.WithoutTakeover())
		}
		var st store.Store = s
		if crash && i == 0 {
			set, ok := s.(store.Settler)
			if !ok {
				t.Fatalf("%T keeps no marks (store.Settler)", s)
			}
			crasher = &crashAfterClaim{TxStore: s, set: set}
			st = crasher
		}
		e, err := core.New(st, opts...)
		if err != nil {
			t.Fatal(err)
		}
		resolver := core.WithResolver(func(ctx context.Context, rec store.Record) (core.Resolution, error) {
			mu.Lock()
			n := charges[rec.ID.DownstreamKey("charge")]
			mu.Unlock()
			if n == 0 {
				return core.Resolution{Outcome: core.OutcomeNotApplied}, nil
			}
			return core.Resolution{}, nil // charged: the attempt that charged records its own answer
		})
		finish := core.Finish(func(ctx context.Context, req core.RecordedRequest) *core.Response {
			return charge(ctx, string(req.Body))
		})
		ropts := []core.RouteOption{core.Name("payments"), core.RecordRequest(nil), resolver, finish}
		if mode.leased {
			ropts = append(ropts, core.Leased())
		}
		h := e.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			b, _ := io.ReadAll(r.Body)
			resp := charge(r.Context(), string(b))
			for k, v := range resp.Header {
				w.Header()[k] = v
			}
			w.WriteHeader(resp.Status)
			_, _ = w.Write(resp.Body)
		}), ropts...)
		c := e.Completer()
		if err := c.Check(); err != nil {
			t.Fatal(err)
		}
		c.Parallel = run.parallel
		reps[i] = &replica{e: e, mux: h, c: c}
	}
	if run.parallel > 0 {
		const n = 8
		keys := make([]string, n)
		for i := range keys {
			keys[i] = fmt.Sprintf("finisher-parallel-%d-%s", i, Table())
			first.Store(true)
			if w := pay(reps[i%2], keys[i], keys[i]); w.Code != http.StatusBadGateway {
				t.Fatalf("payment %d: first attempt %d %s, want 502 (indeterminate)", i, w.Code, w.Body)
			}
		}
		clock.add(2 * core.DefaultLease)
		results, _ := raceSettlers(t, 0, reps, "", "")
		if f := results[0].Finished + results[1].Finished; f != n {
			t.Errorf("the completers finished %d of %d payments (%+v, %+v), want each once", f, n, results[0], results[1])
		}
		for i, key := range keys {
			if w := pay(reps[1], key, key); w.Code != http.StatusCreated || w.Body.String() != `{"paid":"`+key+`"}` {
				t.Errorf("payment %d: a later retry: %d %s, want its one charge's 201", i, w.Code, w.Body)
			}
		}
		mu.Lock()
		defer mu.Unlock()
		for k, c := range charges {
			if c != 1 {
				t.Errorf("downstream key %s charged %d times, want once", k, c)
			}
		}
		if len(charges) != n || runs.Load() != 2*n {
			t.Errorf("%d keys charged and %d runs, want %d and %d (each payment's failed attempt and one finisher)", len(charges), runs.Load(), n, 2*n)
		}
		return
	}
	for round := range rounds {
		runs.Store(0)
		key := fmt.Sprintf("finisher-%d-%v-%s", round, crash, Table())
		body := key
		want := `{"paid":"` + body + `"}`
		var results []core.CompleteResult
		if crash {
			crasher.crash.Store(true)
			if w := pay(reps[0], key, body); w.Code != http.StatusServiceUnavailable || runs.Load() != 0 {
				t.Fatalf("round %d: the attempt that died after its claim: %d %s (%d runs), want the engine's 503 and no run", round, w.Code, w.Body, runs.Load())
			}
			clock.add(2 * core.DefaultLease)
			if round%2 == 0 {
				// No client: the completers alone settle it.
				results, _ = raceSettlers(t, round, reps, "", "")
				if n := results[0].Finished + results[1].Finished; n != 1 {
					t.Errorf("round %d: the completers finished %d times (%+v, %+v), want once, without a client", round, n, results[0], results[1])
				}
			} else {
				// A client's retry meets the completers: it takes the
				// lapsed lease over, or (WithoutTakeover) settles it as
				// indeterminate and resolves it, and runs.
				var retry *httptest.ResponseRecorder
				results, retry = raceSettlers(t, round, reps, key, body)
				// WithoutTakeover: the retry settled the lapsed lease as
				// indeterminate (500), and its resolver, asked after the
				// finisher charged, could not tell (see racingRetryOK).
				if !racingRetryOK(retry.Code, http.StatusInternalServerError) {
					t.Errorf("round %d: the racing retry got %d %s, want the 201, or 409 while a finisher runs", round, retry.Code, retry.Body)
				}
			}
		} else {
			first.Store(true)
			if w := pay(reps[0], key, body); w.Code != http.StatusBadGateway {
				t.Fatalf("round %d: first attempt %d %s, want 502 (indeterminate)", round, w.Code, w.Body)
			}
			clock.add(2 * core.DefaultLease)
			var retry *httptest.ResponseRecorder
			results, retry = raceSettlers(t, round, reps, key, body)
			if !racingRetryOK(retry.Code, http.StatusBadGateway) {
				t.Errorf("round %d: the racing retry got %d %s, want the 201, 409 while a finisher runs, or the recorded 502", round, retry.Code, retry.Body)
			}
		}
		for i, rp := range reps {
			if w := pay(rp, key, body); w.Code != http.StatusCreated || w.Body.String() != want {
				t.Errorf("round %d: a later retry on replica %d: %d %s, want the one charge's 201", round, i, w.Code, w.Body)
			}
		}
		mu.Lock()
		total := 0
		for _, c := range charges {
			total += c
		}
		mu.Unlock()
		if total != round+1 { // one charge per round, each by its own key
			t.Errorf("round %d: %d charges in all, want %d: exactly one for this key (completers: %+v, %+v)", round, total, round+1, results[0], results[1])
		}
		wantRuns := int32(2) // the failed attempt and one run
		if crash {
			wantRuns = 1 // the attempt that died never ran
		}
		if r := runs.Load(); r != wantRuns {
			t.Errorf("round %d: the handler and the finisher ran %d times in all, want %d", round, r, wantRuns)
		}
	}
}

// racingRetryOK reports whether code is an answer a client's retry may
// get while the completers finish its payment: the finisher's 201, 409
// while the finisher runs, or the record's indeterminate answer
// (indeterminate), which is right when the retry read the record and
// its resolver could not tell before any completer had released it (the
// record was indeterminate and nobody was settling it at that moment).
// A retry whose resolver could not tell while a completer released or
// claimed the record answers from the record as it is then (the engine
// reads it again after an unresolved answer: core's
// TestResolverUnresolvedWhileAnotherSettles). Every later retry gets
// the 201 (checked after).
func racingRetryOK(code, indeterminate int) bool {
	return code == http.StatusCreated || code == http.StatusConflict || code == indeterminate
}

// pay sends one payment to a replica.
func pay(rp *replica, key, body string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(http.MethodPost, "/payments", strings.NewReader(body))
	r.Header.Set(core.HeaderKey, key)
	w := httptest.NewRecorder()
	rp.mux.ServeHTTP(w, r)
	return w
}

// raceSettlers starts, at one moment, every replica's completer and,
// unless key is empty, a client's retry of the payment on the second
// replica, and returns the completers' results and the retry's answer
// (nil without one).
func raceSettlers(t *testing.T, round int, reps []*replica, key, body string) ([]core.CompleteResult, *httptest.ResponseRecorder) {
	var wg sync.WaitGroup
	gate := make(chan struct{})
	results := make([]core.CompleteResult, len(reps))
	for i, rp := range reps {
		wg.Go(func() {
			<-gate
			res, err := rp.c.Complete(ctxT(t))
			if err != nil {
				t.Errorf("round %d: replica %d's completer: %v", round, i, err)
			}
			results[i] = res
		})
	}
	var retry *httptest.ResponseRecorder
	if key != "" {
		wg.Go(func() {
			<-gate
			retry = pay(reps[1], key, body)
		})
	}
	close(gate)
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(3 * failsafe):
		_ = pprof.Lookup("goroutine").WriteTo(os.Stderr, 1)
		t.Fatalf("round %d: the completers and the retry did not end within %v (goroutines above)", round, 3*failsafe)
	}
	return results, retry
}
