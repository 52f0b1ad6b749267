package scenario

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/memstore"
	"github.com/idemkit/idem/core/observe"
	"github.com/idemkit/idem/core/store"
)

// Route is one route the suite registers on the router under test.
type Route struct {
	Method  string             // "POST", "GET", ...
	Pattern string             // ServeMux/chi syntax: "/orders/{id}/refunds"; adapters translate ({id} → :id for Gin/Echo)
	Options []core.RouteOption // per-route options for the adapter's middleware (e.g. core.Scope("x"))
	Handler http.HandlerFunc   // the business handler; gets the request the adapter passes on (with the engine's context)
	// Skip: a GlobalFactory leaves the route out of its install with the
	// adapter's skipper (Config.Skipper, Fiber's Next): the route runs
	// unprotected. Only RunGlobal's SkippedRoute sets it.
	Skip bool
}

// Factory builds a router that serves routes through the adapter under test,
// each route protected by the adapter's middleware for engine e with the
// route's Options (per-route middleware, not global). See the package
// documentation for what it must and must not install.
type Factory func(t *testing.T, e *core.Engine, routes []Route) http.Handler

// GlobalFactory builds a router with the adapter's middleware for engine e
// installed once for the whole router (r.Use), without route options, and
// routes registered behind it. Route.Options is always empty in the global
// scenarios. The middleware must leave the requests the router answers
// itself (404, 405) untouched and label decisions with the route pattern
// (Event.Route), which for some routers is only known after routing: a
// router that cannot tell it to a global middleware (net/http's ServeMux
// sets Request.Pattern only when it calls the route's handler) wraps each
// route's handler instead.
type GlobalFactory func(t *testing.T, e *core.Engine, routes []Route) http.Handler

// Run runs every scenario through f, each as a subtest with its own engine
// and store, in both modes (leased: memstore.New(); atomic:
// memstore.New().Atomic()) where the scenario applies to both.
func Run(t *testing.T, f Factory, opts ...Option) {
	t.Helper()
	if f == nil {
		t.Fatal("scenario.Run: nil Factory")
	}
	run(t, scenarios, builder(f), true, opts)
}

// RunGlobal runs the scenarios that concern a middleware installed for the
// whole router, above all that the scope is empty (never the route or the
// path) while the fingerprint covers the concrete path and query: two
// requests to /orders/1/refunds and /orders/2/refunds, or to /orders and
// /orders/1/cancel, with the same key address one record, and the second
// gets a 422; and that the router's own 404 and 405 pass untouched.
func RunGlobal(t *testing.T, f GlobalFactory, opts ...Option) {
	t.Helper()
	if f == nil {
		t.Fatal("scenario.RunGlobal: nil GlobalFactory")
	}
	run(t, globalScenarios, builder(f), true, opts)
}

// Option changes what the suite runs on. See OnStore and Except.
type Option interface{ apply(*options) }

type options struct {
	newStore func(t *testing.T) store.Store
	except   map[string]string // scenario name → why it is left out (Except)
}

type optionFunc func(*options)

func (f optionFunc) apply(o *options) { f(o) }

// OnStore runs the scenarios on the stores newStore returns (a fresh,
// empty one per scenario; it may register its own cleanup) instead of
// memstore: leased mode always, atomic mode only when the store is a
// store.TxStore (otherwise the atomic-mode scenarios are skipped, and
// RunWithin skips all of its). The suite reads records back with Get and
// counts them with store.Inspector's List, so the store must implement
// store.Inspector. A store module's own test module runs the suite through
// every adapter with it (redisstore/redistest).
func OnStore(newStore func(t *testing.T) store.Store) Option {
	return optionFunc(func(o *options) { o.newStore = newStore })
}

// builder is what both factory kinds have in common.
type builder func(t *testing.T, e *core.Engine, routes []Route) http.Handler

// scenario is one rule of the contract and the check of it.
type scenario struct {
	name  string // subtest name, CamelCase, names the behaviour (go test -run 'Scenarios/leased/Replay')
	rule  string // one sentence stating the rule, printed when the scenario fails
	modes modes  // where the rule applies
	fn    func(t *testing.T, x *harness)
}

// mode is the engine's mode for a scenario.
type mode int

const (
	leased mode = 1 << iota
	atomicMode
)

func (m mode) String() string {
	if m == atomicMode {
		return "atomic"
	}
	return "leased"
}

// modes is a set of modes.
type modes = mode

const both = leased | atomicMode

// run runs list with routers from build; labelled: they label every
// decision with the route pattern (the middleware does; Route.Within
// called by hand does not know it).
func run(t *testing.T, list []scenario, build builder, labelled bool, opts []Option) {
	t.Helper()
	var o options
	for _, opt := range opts {
		if opt != nil {
			opt.apply(&o)
		}
	}
	o.check(t, list)
	for _, m := range []mode{leased, atomicMode} {
		if !slices.ContainsFunc(list, func(s scenario) bool { return s.modes&m != 0 }) {
			continue
		}
		t.Run(m.String(), func(t *testing.T) {
			for _, s := range list {
				if s.modes&m == 0 {
					continue
				}
				t.Run(s.name, func(t *testing.T) {
					if reason, ok := o.except[s.name]; ok {
						t.Skipf("left out for this adapter: %s", reason)
					}
					t.Cleanup(func() {
						if t.Failed() {
							t.Logf("rule: %s", s.rule)
						}
					})
					x := newHarness(t, m, build, o)
					x.labelled = labelled
					s.fn(t, x)
				})
			}
		})
	}
}

// failsafe bounds every wait of the suite, so a router that blocks fails a
// scenario instead of hanging the run. It is never a latency assertion.
const failsafe = 10 * time.Second

// epoch is where the suite's clock starts.
var epoch = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)

// harness is the world of one scenario: a store, a clock, and (after start)
// an engine and the router under test.
type harness struct {
	t     *testing.T
	mode  mode
	build builder
	other builder // RunAcross: the second router's factory
	// labelled: the router under test tells the engine its route
	// pattern, so every decision carries it (Event.Route).
	labelled bool
	clock    *clock
	records  store.Inspector // the records, whatever the mode: memstore, or OnStore's
	hooks    *hookStore      // what the engine sees (wraps mem)
	store    store.Store     // hooks, as a store.TxStore in atomic mode
	logger   *slog.Logger
	logRec   *logRecorder // what the logger wrote

	engine *core.Engine
	h      http.Handler     // the router, wrapped in the suite's recovery
	srv    *httptest.Server // set by startTCP

	mu     sync.Mutex
	events []observe.Event // every decision the engines reported (WithObserver)
	panics []any           // values recovered by the suite's recovery
	gates  []*gate         // opened when the scenario ends
	wg     sync.WaitGroup
}

func newHarness(t *testing.T, m mode, build builder, o options) *harness {
	x := &harness{t: t, mode: m, build: build, clock: newClock(epoch)}
	x.hooks = &hookStore{blocked: make(chan struct{}, 1)}
	var inner store.Store
	if o.newStore == nil {
		mem := memstore.New()
		x.records, inner = mem, mem
		if m == atomicMode {
			inner = mem.Atomic()
		}
	} else {
		inner = o.newStore(t)
		ins, ok := inner.(store.Inspector)
		if !ok {
			t.Fatalf("scenario.OnStore: %T does not implement store.Inspector, which the suite counts records with", inner)
		}
		x.records = ins
		if _, tx := inner.(store.TxStore); m == atomicMode && !tx {
			t.Skipf("%T is not a store.TxStore: atomic mode does not apply", inner)
		}
	}
	x.hooks.inner = inner
	x.store = x.hooks
	if m == atomicMode {
		x.store = &hookTxStore{hookStore: x.hooks, tx: inner.(store.TxStore)}
	}
	x.logRec = newLogRecorder(slog.NewTextHandler(newTestWriter(t), &slog.HandlerOptions{Level: slog.LevelDebug}))
	x.logger = slog.New(x.logRec)
	// Registered first, so it runs last: let every held handler go, wait
	// for every request still running, then stop the server.
	t.Cleanup(func() {
		x.mu.Lock()
		gates := x.gates
		x.mu.Unlock()
		for _, g := range gates {
			g.open()
		}
		done := make(chan struct{})
		go func() { x.wg.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(failsafe):
			t.Error("requests still running when the scenario ended")
		}
		if x.srv != nil {
			x.srv.Close()
		}
	})
	return x
}

// callerFromHeader is the suite's caller function: the X-Caller header.
func callerFromHeader(r *http.Request) (string, error) {
	c := r.Header.Get("X-Caller")
	if c == "" {
		return "", fmt.Errorf("no X-Caller header")
	}
	return c, nil
}

// start builds the engine with the suite's defaults and opts, and the
// router under test with routes.
func (x *harness) start(opts []core.Option, routes ...Route) {
	x.t.Helper()
	x.engine, x.h = x.serve(x.build, opts, routes)
}

// serve builds an engine over the harness's store with the suite's
// defaults and opts, and a router with build and routes, wrapped in the
// suite's recovery.
func (x *harness) serve(build builder, opts []core.Option, routes []Route) (*core.Engine, http.Handler) {
	x.t.Helper()
	base := []core.Option{
		core.WithCaller(callerFromHeader),
		core.WithLogger(x.logger),
		core.WithClock(x.clock.Now),
		core.WithObserver(x.observe),
	}
	e, err := core.New(x.store, append(base, opts...)...)
	if err != nil {
		x.t.Fatalf("core.New: %v", err)
	}
	h := build(x.t, e, routes)
	if h == nil {
		x.t.Fatal("the factory returned a nil handler")
	}
	return e, x.recoverer(h)
}

// startTCP is start, serving the router on an httptest.Server.
func (x *harness) startTCP(opts []core.Option, routes ...Route) {
	x.t.Helper()
	x.start(opts, routes...)
	x.srv = httptest.NewServer(x.h)
}

// observe is the engines' observer: it keeps every event.
func (x *harness) observe(_ context.Context, ev observe.Event) {
	x.mu.Lock()
	x.events = append(x.events, ev)
	x.mu.Unlock()
}

// observed returns the events the engines have reported.
func (x *harness) observed() []observe.Event {
	x.mu.Lock()
	defer x.mu.Unlock()
	return append([]observe.Event(nil), x.events...)
}

// recoverer is the suite's outer recovery: it keeps the panic value and
// answers 500.
func (x *harness) recoverer(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			if v := recover(); v != nil {
				x.mu.Lock()
				x.panics = append(x.panics, v)
				x.mu.Unlock()
				w.WriteHeader(http.StatusInternalServerError)
				_, _ = io.WriteString(w, "recovered by the suite")
			}
		}()
		next.ServeHTTP(w, r)
	})
}

// recovered returns the panic values the suite's recovery has seen.
func (x *harness) recovered() []any {
	x.mu.Lock()
	defer x.mu.Unlock()
	return append([]any(nil), x.panics...)
}

// --- requests and results ---------------------------------------------------

// request is a request the suite sends.
type request struct {
	method, path, body string
	header             http.Header
	unknownLength      bool            // send the body without Content-Length
	ctx                context.Context // nil: context.Background()
}

// newRequest returns a request from caller "alice" with a JSON body and,
// unless key is "", an Idempotency-Key.
func newRequest(method, path, body, key string) *request {
	r := &request{method: method, path: path, body: body, header: http.Header{}}
	r.header.Set("X-Caller", "alice")
	if body != "" {
		r.header.Set("Content-Type", "application/json")
	}
	if key != "" {
		r.header.Set(core.HeaderKey, key)
	}
	return r
}

// post is newRequest for POST.
func post(path, body, key string) *request { return newRequest(http.MethodPost, path, body, key) }

// as sets the caller; "" removes the X-Caller header.
func (r *request) as(caller string) *request {
	if caller == "" {
		return r.set("X-Caller")
	}
	return r.set("X-Caller", caller)
}

// set replaces the values of a request header; no values removes it.
func (r *request) set(name string, values ...string) *request {
	name = http.CanonicalHeaderKey(name)
	if len(values) == 0 {
		delete(r.header, name)
		return r
	}
	r.header[name] = values
	return r
}

// result is what a client observed.
type result struct {
	Status int
	Header http.Header
	Body   string
	Err    error // transport error (TCP only)
}

func (r result) String() string {
	return fmt.Sprintf("%d %v %q", r.Status, r.Header, r.Body)
}

// replayed reports whether the result carries Idempotent-Replayed: true.
func (r result) replayed() bool { return r.Header.Get(core.HeaderReplayed) == "true" }

// do sends r to the router and returns what the client observed.
func (x *harness) do(r *request) result {
	if x.h == nil {
		panic("scenario: do before start")
	}
	if x.srv != nil {
		return x.doTCP(r)
	}
	return x.doOn(x.h, r)
}

// doOn sends r to h (directly, without TCP) and returns what the client
// observed.
func (x *harness) doOn(h http.Handler, r *request) result {
	var body io.Reader = strings.NewReader(r.body)
	if r.unknownLength {
		body = io.MultiReader(body) // hides the length from httptest.NewRequest
	}
	hr := httptest.NewRequest(r.method, r.path, body)
	if r.body == "" {
		hr.Body, hr.ContentLength = http.NoBody, 0
	}
	if r.unknownLength {
		hr.ContentLength = -1
	}
	hr.Header = r.header.Clone()
	if r.ctx != nil {
		hr = hr.WithContext(r.ctx)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, hr)
	res := rec.Result()
	b, _ := io.ReadAll(res.Body)
	return result{Status: res.StatusCode, Header: res.Header, Body: string(b)}
}

func (x *harness) doTCP(r *request) result {
	var body io.Reader
	if r.body != "" {
		body = strings.NewReader(r.body)
		if r.unknownLength {
			body = io.MultiReader(body)
		}
	}
	ctx := r.ctx
	if ctx == nil {
		ctx = context.Background()
	}
	hr, err := http.NewRequestWithContext(ctx, r.method, x.srv.URL+r.path, body)
	if err != nil {
		return result{Err: err}
	}
	hr.Header = r.header.Clone()
	res, err := x.srv.Client().Do(hr)
	if err != nil {
		return result{Err: err}
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	return result{Status: res.StatusCode, Header: res.Header, Body: string(b), Err: err}
}

// goDo sends r from another goroutine; the answer arrives on the channel.
func (x *harness) goDo(r *request) <-chan result {
	ch := make(chan result, 1)
	x.wg.Add(1)
	go func() {
		defer x.wg.Done()
		ch <- x.do(r)
	}()
	return ch
}

// await returns the answer on ch, failing the scenario if none comes within
// the failsafe; what says what was awaited.
func (x *harness) await(ch <-chan result, what string) result {
	x.t.Helper()
	select {
	case res := <-ch:
		if res.Err != nil {
			x.t.Fatalf("%s: %v", what, res.Err)
		}
		return res
	case <-time.After(failsafe):
		x.t.Fatalf("%s: no answer within %v (the router blocks)", what, failsafe)
	}
	return result{}
}

// gate holds a handler open until the scenario opens it.
type gate struct {
	entered chan struct{}
	release chan struct{}
	once    sync.Once
}

// gate returns a new gate, opened at the latest when the scenario ends.
func (x *harness) gate() *gate {
	g := &gate{entered: make(chan struct{}, 64), release: make(chan struct{})}
	x.mu.Lock()
	x.gates = append(x.gates, g)
	x.mu.Unlock()
	return g
}

// hold is called by a handler: it signals that it entered and blocks until
// the gate opens.
func (g *gate) hold() {
	g.entered <- struct{}{}
	<-g.release
}

// open lets every held handler go, now and later.
func (g *gate) open() { g.once.Do(func() { close(g.release) }) }

// waitEntered waits until a handler holds at the gate.
func (x *harness) waitEntered(g *gate, what string) {
	x.t.Helper()
	select {
	case <-g.entered:
	case <-time.After(failsafe):
		x.t.Fatalf("%s: the handler was not called within %v", what, failsafe)
	}
}

// waitBlocked waits until a request has met an in-progress record in the
// store (a claim answered with StateInProgress).
func (x *harness) waitBlocked(what string) {
	x.t.Helper()
	select {
	case <-x.hooks.blocked:
	case <-time.After(failsafe):
		x.t.Fatalf("%s: no request met the in-progress record within %v", what, failsafe)
	}
}

// --- the clock --------------------------------------------------------------

// clock is the engine's time source. Time stands still unless the scenario
// moves it, or sets a step by which every reading advances it.
type clock struct {
	mu   sync.Mutex
	now  time.Time
	step time.Duration
}

func newClock(t time.Time) *clock { return &clock{now: t} }

// Now returns the current time and then advances it by the step.
func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := c.now
	c.now = c.now.Add(c.step)
	return t
}

// Advance moves the clock forward by d.
func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// Step makes every reading of the clock advance it by d (0: stand still).
func (c *clock) Step(d time.Duration) {
	c.mu.Lock()
	c.step = d
	c.mu.Unlock()
}

// --- logging ----------------------------------------------------------------

// testWriter sends log lines to t.Log until the test ends.
type testWriter struct {
	mu   sync.Mutex
	t    *testing.T
	done bool
}

func newTestWriter(t *testing.T) *testWriter {
	w := &testWriter{t: t}
	t.Cleanup(func() {
		w.mu.Lock()
		w.done = true
		w.mu.Unlock()
	})
	return w
}

func (w *testWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.done {
		w.t.Log(strings.TrimSuffix(string(p), "\n"))
	}
	return len(p), nil
}
