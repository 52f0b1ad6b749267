package core_test

import (
	"context"
	"encoding/json"
	"errors"
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

// shop is a payment service on one engine (a replica) over a shared
// store, with its payment route named for the completer: the handler
// marks the charge and then answers what answer says (502 by default:
// the provider timed out, so the record is left indeterminate), after
// block (if not nil) is closed. The resolver asks provider, the fake
// payment provider, about the charge's downstream key.
type shop struct {
	e        *core.Engine
	mux      http.Handler
	ran      atomic.Int32
	answer   atomic.Int32
	block    chan struct{}
	inside   chan struct{}
	keys     chan string // the downstream keys the handler charged with
	provider *provider
	events   *events
}

// provider is a payment provider that keeps the charges it made, by
// downstream key.
type provider struct {
	mu      sync.Mutex
	charges map[string]string // downstream key -> body of the charge
	asked   atomic.Int32
}

func (p *provider) charge(key, body string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.charges == nil {
		p.charges = map[string]string{}
	}
	p.charges[key] = body
}

func (p *provider) lookup(key string) (string, bool) {
	p.asked.Add(1)
	p.mu.Lock()
	defer p.mu.Unlock()
	b, ok := p.charges[key]
	return b, ok
}

// events keeps what the Observer saw.
type events struct {
	mu sync.Mutex
	ev []observe.Event
}

func (o *events) observe(_ context.Context, ev observe.Event) {
	o.mu.Lock()
	o.ev = append(o.ev, ev)
	o.mu.Unlock()
}

func (o *events) count(d observe.Decision) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	n := 0
	for _, ev := range o.ev {
		if ev.Decision == d {
			n++
		}
	}
	return n
}

// resolveByProvider is the shop's resolver: the charge happened when the
// provider knows the downstream key; the answer is rebuilt from the
// recorded request.
func resolveByProvider(p *provider, t *testing.T) core.Resolver {
	return func(ctx context.Context, rec store.Record) (core.Resolution, error) {
		req, ok := core.ResolvingRequest(ctx)
		if !ok {
			t.Error("the resolver got no request")
			return core.Resolution{}, errors.New("no request")
		}
		if _, ok := p.lookup(rec.ID.DownstreamKey("charge")); !ok {
			return core.Resolution{Outcome: core.OutcomeNotApplied}, nil
		}
		return core.Resolution{Outcome: core.OutcomeApplied, Response: &core.Response{Status: http.StatusCreated,
			Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(`{"resolved":` + string(req.Body) + `}`)}}, nil
	}
}

func newShop(t *testing.T, store store.Store, p *provider, clock *fakeClock, opts ...core.RouteOption) *shop {
	t.Helper()
	s := &shop{inside: make(chan struct{}, 8), keys: make(chan string, 8), provider: p, events: &events{}}
	e, err := core.New(store, core.WithSingleCaller(), quiet, core.WithClock(clock.Now), core.WithObserver(s.events.observe))
	if err != nil {
		t.Fatal(err)
	}
	s.e = e
	s.answer.Store(http.StatusBadGateway)
	route := append([]core.RouteOption{core.Name("payments"), core.RecordRequest(nil), core.WithResolver(resolveByProvider(p, t))}, opts...)
	mux := http.NewServeMux()
	mux.Handle("POST /payments", e.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.ran.Add(1)
		key, err := core.DownstreamKey(r.Context(), "charge")
		if err != nil {
			t.Error(err)
		}
		if err := core.MarkEffect(r.Context()); err != nil {
			t.Error(err)
		}
		s.keys <- key
		s.inside <- struct{}{}
		if s.block != nil {
			<-s.block
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(int(s.answer.Load()))
		_, _ = w.Write([]byte(`{"charge":"ch_1"}`))
	}), route...))
	s.mux = mux
	return s
}

func (s *shop) pay(key string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(http.MethodPost, "/payments", strings.NewReader(`{"amount":100}`))
	r.Header.Set("Content-Type", "application/json")
	r.Header.Set(core.HeaderKey, key)
	w := httptest.NewRecorder()
	s.mux.ServeHTTP(w, r)
	return w
}

// completer returns the shop's completer with a backoff of a minute.
func (s *shop) completer(t *testing.T) *core.Completer {
	t.Helper()
	c := s.e.Completer()
	c.Backoff, c.MaxBackoff = time.Minute, time.Minute
	if err := c.Check(); err != nil {
		t.Fatal(err)
	}
	return c
}

func complete(t *testing.T, c *core.Completer) core.CompleteResult {
	t.Helper()
	res, err := c.Complete(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// An indeterminate payment whose charge the provider made is settled by
// the completer, without a client: the resolver is given the recorded
// request and its answer is recorded, so the client's retry (whenever it
// comes) replays it and the handler never runs again. A record is not
// visited before a lease has passed since its claim.
func TestCompleterSettlesIndeterminateAsApplied(t *testing.T) {
	for _, atomicMode := range []bool{false, true} {
		t.Run(map[bool]string{false: "leased", true: "atomic"}[atomicMode], func(t *testing.T) {
			var store store.Store = memstore.New()
			if atomicMode {
				store = memstore.New().Atomic()
			}
			clock := &fakeClock{now: adminT0}
			p := &provider{}
			s := newShop(t, store, p, clock)
			if w := s.pay("k1"); w.Code != http.StatusBadGateway {
				t.Fatalf("first attempt: %d", w.Code)
			}
			p.charge(<-s.keys, `{"amount":100}`) // the provider charged after all
			c := s.completer(t)
			if res := complete(t, c); res.Visited != 0 {
				t.Fatalf("visited before a lease passed: %+v", res)
			}
			clock.Add(core.DefaultLease)
			if res := complete(t, c); res.Settled != 1 || res.Visited != 1 {
				t.Fatalf("pass: %+v, want one settled", res)
			}
			w := s.pay("k1")
			if w.Code != http.StatusCreated || w.Body.String() != `{"resolved":{"amount":100}}` || s.ran.Load() != 1 {
				t.Fatalf("retry: %d %s (handler ran %d times), want the resolver's answer replayed", w.Code, w.Body, s.ran.Load())
			}
			if n := s.events.count(observe.DecisionSettled); n != 1 {
				t.Fatalf("%d settled events, want 1", n)
			}
			clock.Add(time.Hour)
			if res := complete(t, c); res.Visited != 0 {
				t.Fatalf("a settled record was visited again: %+v", res)
			}
		})
	}
}

// When the provider has no charge, the completer releases the record
// (the next retry runs), or, on a route with Finish, runs the recorded
// request again in the background with the same downstream key, and
// records its answer for the retry.
func TestCompleterNotApplied(t *testing.T) {
	t.Run("released", func(t *testing.T) {
		clock := &fakeClock{now: adminT0}
		s := newShop(t, memstore.New(), &provider{}, clock)
		s.pay("k1")
		<-s.keys
		clock.Add(core.DefaultLease)
		if res := complete(t, s.completer(t)); res.Released != 1 {
			t.Fatalf("pass: %+v, want one released", res)
		}
		s.answer.Store(http.StatusCreated)
		if w := s.pay("k1"); w.Code != http.StatusCreated || s.ran.Load() != 2 {
			t.Fatalf("retry: %d, handler ran %d times, want it run again", w.Code, s.ran.Load())
		}
		if n := s.events.count(observe.DecisionSettleReleased); n != 1 {
			t.Fatalf("%d settle_released events", n)
		}
	})
	t.Run("finished", func(t *testing.T) {
		clock := &fakeClock{now: adminT0}
		p := &provider{}
		var finishKeys []string
		finish := core.Finish(func(ctx context.Context, req core.RecordedRequest) *core.Response {
			key, err := core.DownstreamKey(ctx, "charge")
			if err != nil {
				t.Error(err)
			}
			if err := core.MarkEffect(ctx); err != nil {
				t.Error(err)
			}
			finishKeys = append(finishKeys, key)
			p.charge(key, string(req.Body))
			return &core.Response{Status: http.StatusCreated, Header: http.Header{"Content-Type": {"application/json"}},
				Body: []byte(`{"finished":` + string(req.Body) + `,"method":"` + req.Method + `","path":"` + req.Path + `"}`)}
		})
		s := newShop(t, memstore.New(), p, clock, finish)
		s.pay("k1")
		first := <-s.keys
		clock.Add(core.DefaultLease)
		if res := complete(t, s.completer(t)); res.Finished != 1 {
			t.Fatalf("pass: %+v, want one finished", res)
		}
		if len(finishKeys) != 1 || finishKeys[0] != first {
			t.Fatalf("the finisher charged with %q, the first attempt with %q: want the same downstream key", finishKeys, first)
		}
		w := s.pay("k1")
		if w.Code != http.StatusCreated || w.Body.String() != `{"finished":{"amount":100},"method":"POST","path":"/payments"}` || s.ran.Load() != 1 {
			t.Fatalf("retry: %d %s (handler ran %d), want the finisher's answer replayed", w.Code, w.Body, s.ran.Load())
		}
		if n := s.events.count(observe.DecisionFinished); n != 1 {
			t.Fatalf("%d finished events", n)
		}
	})
}

// An attempt that stopped without recording an outcome (its lease
// lapsed) is settled by the completer as an indeterminate one is; the
// old attempt, should it still be alive, is fenced. A live lease is not
// touched.
func TestCompleterSettlesALapsedLease(t *testing.T) {
	clock := &fakeClock{now: adminT0}
	p := &provider{}
	s := newShop(t, memstore.New(), p, clock)
	s.block = make(chan struct{})
	s.answer.Store(http.StatusCreated)
	zombie := make(chan *httptest.ResponseRecorder, 1)
	go func() { zombie <- s.pay("k1") }()
	<-s.inside
	p.charge(<-s.keys, "{}")
	c := s.completer(t)
	clock.Add(core.DefaultLease / 2)
	if res := complete(t, c); res.Visited != 0 {
		t.Fatalf("visited under a live lease: %+v", res)
	}
	clock.Add(core.DefaultLease)
	if res := complete(t, c); res.Settled != 1 {
		t.Fatalf("pass: %+v, want the lapsed lease settled", res)
	}
	close(s.block)
	if w := <-zombie; w.Code != http.StatusConflict {
		t.Fatalf("the old attempt's answer: %d %s, want 409 (fenced)", w.Code, w.Body)
	}
	if w := s.pay("k1"); w.Code != http.StatusCreated || !strings.Contains(w.Body.String(), "resolved") {
		t.Fatalf("retry: %d %s", w.Code, w.Body)
	}
}

// A record the resolver cannot settle is visited with a growing backoff
// and, after MaxTries visits, left for the operator: a WARN names it
// and the Observer sees "left"; it is not visited again.
func TestCompleterLeavesARecordAfterMaxTries(t *testing.T) {
	clock := &fakeClock{now: adminT0}
	var asked atomic.Int32
	unknown := core.WithResolver(func(context.Context, store.Record) (core.Resolution, error) {
		asked.Add(1)
		return core.Resolution{}, nil
	})
	s := newShop(t, memstore.New(), &provider{}, clock, unknown)
	s.pay("k1")
	<-s.keys
	c := s.completer(t)
	c.MaxTries = 3
	c.Backoff, c.MaxBackoff = time.Minute, 10*time.Minute
	clock.Add(core.DefaultLease)
	for i := 1; i <= 3; i++ {
		if res := complete(t, c); res.Visited != 1 {
			t.Fatalf("visit %d: %+v", i, res)
		}
		if res := complete(t, c); res.Visited != 0 {
			t.Fatalf("visited again before the backoff: %+v", res)
		}
		clock.Add(time.Duration(1<<(i-1)) * time.Minute) // 1, 2, 4 minutes
	}
	if res := complete(t, c); res.Left != 1 {
		t.Fatalf("after 3 visits: %+v, want left", res)
	}
	if asked.Load() != 3 {
		t.Fatalf("the resolver was asked %d times, want 3", asked.Load())
	}
	if n := s.events.count(observe.DecisionLeft); n != 1 {
		t.Fatalf("%d left events", n)
	}
	clock.Add(time.Hour)
	if res := complete(t, c); res.Visited != 0 {
		t.Fatalf("a left record was visited again: %+v", res)
	}
	// The operator still can settle it.
	rec := onlyRecord(t, s.e, store.StateIndeterminate)
	if err := s.e.ReleaseRecord(context.Background(), mustID(t, rec.ID), "no charge at the provider"); err != nil {
		t.Fatal(err)
	}
	if n := s.events.count(observe.DecisionOperatorReleased); n != 1 {
		t.Fatalf("%d operator_released events, want 1", n)
	}
}

// Two replicas' completers and a client's retry meet one indeterminate
// record at the same moment: the record is settled once (one of them
// records the resolver's answer; the others are fenced or lose the
// visit), the handler never runs again, and every answer the client gets
// is the recorded 502 or the resolved 201. Run with -race.
func TestCompleterRaceWithReplicaAndClient(t *testing.T) {
	for round := range 200 {
		clock := &fakeClock{now: adminT0}
		p := &provider{}
		store := &countCompletions{Store: memstore.New()}
		a := newShop(t, store, p, clock)
		b := newShop(t, store, p, clock)
		a.pay("k1")
		p.charge(<-a.keys, "{}")
		clock.Add(core.DefaultLease)
		var wg sync.WaitGroup
		var settled atomic.Int32
		for _, s := range []*shop{a, b} {
			c := s.completer(t)
			wg.Go(func() {
				res, err := c.Complete(context.Background())
				if err != nil {
					t.Error(err)
				}
				settled.Add(int32(res.Settled))
			})
		}
		var code int
		wg.Go(func() { code = b.pay("k1").Code })
		wg.Wait()
		if code != http.StatusCreated && code != http.StatusBadGateway {
			t.Fatalf("round %d: the client got %d", round, code)
		}
		if n := store.completed.Load(); n != 1 {
			t.Fatalf("round %d: %d completions succeeded (completers reported %d): want exactly one settler", round, n, settled.Load())
		}
		if a.ran.Load()+b.ran.Load() != 1 {
			t.Fatalf("round %d: the handler ran again", round)
		}
		if w := a.pay("k1"); w.Code != http.StatusCreated {
			t.Fatalf("round %d: after the race: %d", round, w.Code)
		}
	}
}

// Misuse fails loudly at start-up: a completer with no named route, a
// named route without a resolver, two routes with one name, Finish
// without RecordRequest, a store that keeps no marks.
func TestCompleterMisuse(t *testing.T) {
	e, err := core.New(memstore.New(), core.WithSingleCaller(), quiet)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Completer().Start(context.Background()); !errors.Is(err, core.ErrConfig) || !strings.Contains(err.Error(), "core.Name") {
		t.Fatalf("no named route: %v", err)
	}
	e.Route(core.Name("refunds"))
	if err := e.Completer().Check(); !errors.Is(err, core.ErrConfig) || !strings.Contains(err.Error(), `"refunds"`) {
		t.Fatalf("named route without resolver: %v", err)
	}
	mustPanic(t, "same name", func() {
		e.Route(core.Name("refunds"), core.WithResolver(func(context.Context, store.Record) (core.Resolution, error) { return core.Resolution{}, nil }))
	})
	mustPanic(t, "Finish without RecordRequest", func() {
		e.Route(core.Name("x"), core.Finish(func(context.Context, core.RecordedRequest) *core.Response { return nil }))
	})
	var c core.Completer
	if err := c.Check(); !errors.Is(err, core.ErrConfig) {
		t.Fatalf("a Completer literal: %v", err)
	}
	plain, err := core.New(noMarks{memstore.New()}, core.WithSingleCaller(), quiet)
	if err != nil {
		t.Fatal(err)
	}
	plain.Route(core.Name("x"))
	if err := plain.Completer().Check(); !errors.Is(err, core.ErrConfig) || !strings.Contains(err.Error(), "Settler") {
		t.Fatalf("a store without marks: %v", err)
	}
}

type noMarks struct{ store.Store }

func mustPanic(t *testing.T, what string, f func()) {
	t.Helper()
	defer func() {
		if recover() == nil {
			t.Fatalf("%s: no panic", what)
		}
	}()
	f()
}

// The recorded request is sealed with the engine's Sealer and what the
// route chose of the body (RecordRequest's function) is all it keeps.
func TestCompleterRecordsChosenFields(t *testing.T) {
	clock := &fakeClock{now: adminT0}
	p := &provider{}
	amount := core.RecordRequest(func(body []byte) ([]byte, error) {
		var v struct {
			Amount int `json:"amount"`
		}
		if err := json.Unmarshal(body, &v); err != nil {
			return nil, err
		}
		return json.Marshal(v)
	})
	s := newShop(t, memstore.New(), p, clock, amount)
	r := httptest.NewRequest(http.MethodPost, "/payments", strings.NewReader(`{"amount":100,"card":"4242"}`))
	r.Header.Set(core.HeaderKey, "k1")
	s.mux.ServeHTTP(httptest.NewRecorder(), r)
	p.charge(<-s.keys, "{}")
	clock.Add(core.DefaultLease)
	if res := complete(t, s.completer(t)); res.Settled != 1 {
		t.Fatalf("%+v", res)
	}
	r = httptest.NewRequest(http.MethodPost, "/payments", strings.NewReader(`{"amount":100,"card":"4242"}`))
	r.Header.Set(core.HeaderKey, "k1")
	w := httptest.NewRecorder()
	s.mux.ServeHTTP(w, r)
	if w.Body.String() != `{"resolved":{"amount":100}}` {
		t.Fatalf("got %s, want only the chosen field recorded", w.Body)
	}
	bad := httptest.NewRequest(http.MethodPost, "/payments", strings.NewReader(`not json`))
	bad.Header.Set(core.HeaderKey, "k2")
	w = httptest.NewRecorder()
	s.mux.ServeHTTP(w, bad)
	if w.Code != http.StatusBadRequest {
		t.Fatalf("a body the fields cannot be read from: %d, want 400", w.Code)
	}
}

// countCompletions counts the completions (state completed) that
// succeed.
type countCompletions struct {
	*memstore.Store
	completed atomic.Int32
}

func (s *countCompletions) Complete(ctx context.Context, id store.ID, token int64, c store.Completion) error {
	err := s.Store.Complete(ctx, id, token, c)
	if err == nil && c.State == store.StateCompleted {
		s.completed.Add(1)
	}
	return err
}

// multiPrimary is an atomic memstore that says what a store on a
// multi-primary cluster says (store.MultiPrimary); asked counts the
// questions.
type multiPrimary struct {
	*memstore.AtomicStore
	multi bool
	asked atomic.Int32
}

func (s *multiPrimary) MultiPrimary(context.Context) (bool, error) {
	s.asked.Add(1)
	return s.multi, nil
}

// A completer refuses to run a finisher on an atomic route over a store
// on a multi-primary cluster, at Start and at every pass, with an error
// that names the route and the fixes; a leased finisher, an atomic route
// without one, and a single-primary store run. The store is asked once.
func TestCompleterRefusesAtomicFinisherOnMultiPrimary(t *testing.T) {
	resolver := core.WithResolver(func(context.Context, store.Record) (core.Resolution, error) { return core.Resolution{}, nil })
	finish := core.Finish(func(context.Context, core.RecordedRequest) *core.Response { return &core.Response{Status: 201} })
	for _, tc := range []struct {
		name    string
		multi   bool
		opts    []core.RouteOption
		refused bool
	}{
		{"nok, atomic finisher on a multi-primary cluster", true, []core.RouteOption{finish}, true},
		{"ok, leased finisher on a multi-primary cluster", true, []core.RouteOption{finish, core.Leased()}, false},
		{"ok, atomic route without a finisher on a multi-primary cluster", true, nil, false},
		{"ok, atomic finisher on a single primary", false, []core.RouteOption{finish}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			store := &multiPrimary{AtomicStore: memstore.New().Atomic(), multi: tc.multi}
			e, err := core.New(store, core.WithSingleCaller(), quiet)
			if err != nil {
				t.Fatal(err)
			}
			e.Route(append([]core.RouteOption{core.Name("payments"), core.RecordRequest(nil), resolver}, tc.opts...)...)
			c := e.Completer()
			c.Every = time.Hour
			err = c.Start(t.Context())
			c.Stop()
			_, perr := c.Complete(t.Context())
			if !tc.refused {
				if err != nil || perr != nil {
					t.Fatalf("Start: %v; Complete: %v; want both to run", err, perr)
				}
				return
			}
			for what, err := range map[string]error{"Start": err, "Complete": perr} {
				if !errors.Is(err, core.ErrConfig) {
					t.Fatalf("%s: %v, want an error wrapping ErrConfig", what, err)
				}
				for _, want := range []string{`"payments"`, "multi-primary", "core.Leased", "WithOneWriterNode"} {
					if !strings.Contains(err.Error(), want) {
						t.Errorf("%s: %q does not name %s", what, err, want)
					}
				}
			}
			if n := store.asked.Load(); n != 1 {
				t.Errorf("the store was asked %d times, want once", n)
			}
		})
	}
}

// The refusal holds for a route registered while a pass runs (Once with
// route options registers its route at its first call; another replica
// may have marked records of it already): the pass checked the routes
// before the route existed, and must not run the route's finisher on a
// multi-primary cluster when it meets its record.
func TestCompleterRefusesAtomicFinisherRegisteredDuringAPass(t *testing.T) {
	clock := &fakeClock{now: adminT0}
	st := &multiPrimary{AtomicStore: memstore.New().Atomic(), multi: true}
	var finished atomic.Int32
	notApplied := core.WithResolver(func(context.Context, store.Record) (core.Resolution, error) {
		return core.Resolution{Outcome: core.OutcomeNotApplied}, nil
	})
	payments := []core.RouteOption{core.Name("payments"), core.RecordRequest(nil), notApplied,
		core.Finish(func(context.Context, core.RecordedRequest) *core.Response {
			finished.Add(1)
			return &core.Response{Status: 201}
		})}
	indeterminate := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := core.MarkEffect(r.Context()); err != nil {
			t.Error(err)
		}
		w.WriteHeader(http.StatusBadGateway)
	})
	post := func(h http.Handler, key string) {
		r := httptest.NewRequest(http.MethodPost, "/", strings.NewReader("{}"))
		r.Header.Set("Idempotency-Key", key)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != http.StatusBadGateway {
			t.Fatalf("%s: %d %s, want 502", key, w.Code, w.Body)
		}
	}
	// This replica: only "refunds" when the pass begins; its resolver
	// registers "payments" (as a first Once call would).
	e, err := core.New(st, core.WithSingleCaller(), quiet, core.WithClock(clock.Now))
	if err != nil {
		t.Fatal(err)
	}
	refunds := e.Handler(indeterminate, core.Name("refunds"), core.RecordRequest(nil),
		core.WithResolver(func(context.Context, store.Record) (core.Resolution, error) {
			e.Route(payments...)
			return core.Resolution{}, nil
		}))
	post(refunds, "refund")
	clock.Add(time.Second)
	// Another replica marked a payment.
	other, err := core.New(st, core.WithSingleCaller(), quiet, core.WithClock(clock.Now))
	if err != nil {
		t.Fatal(err)
	}
	post(other.Handler(indeterminate, payments...), "payment")
	clock.Add(core.DefaultLease + time.Second)
	res, err := e.Completer().Complete(t.Context())
	if n := finished.Load(); n != 0 {
		t.Fatalf("the pass ran the atomic finisher %d times on a multi-primary cluster (pass: %+v, %v), want it refused", n, res, err)
	}
	if res.Failed == 0 && !errors.Is(err, core.ErrConfig) {
		t.Errorf("pass: %+v, %v; want the payment's visit failed with an error wrapping ErrConfig", res, err)
	}
}
