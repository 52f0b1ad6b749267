package scenario

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/store"
)

// Scenarios of composition (docs/contract.md, section 3 "What a client
// observes", the paragraph "Composition never weakens
// the guarantee"): the middleware installed twice on one route, and the
// requests the router answers itself.

// NestedFactory builds a router with the adapter's middleware for engine e
// installed twice on every route: once for the whole router (r.Use),
// without options, and again on the route itself with the route's Options.
// The inner (per-route) layer must be the one protection that runs, with
// its own options; the outer one records nothing.
type NestedFactory func(t *testing.T, e *core.Engine, routes []Route) http.Handler

// RunNested runs the scenarios of a route protected twice (a global
// install plus a per-route one) through f.
func RunNested(t *testing.T, f NestedFactory, opts ...Option) {
	t.Helper()
	if f == nil {
		t.Fatal("scenario.RunNested: nil NestedFactory")
	}
	run(t, nestedScenarios, builder(f), true, opts)
}

// nestedScenarios is the suite RunNested runs.
var nestedScenarios = []scenario{
	{"NestedRunsOnce", "With the middleware installed globally and again on the route, the first request runs the handler once and gets its answer (never the inner layer's own 409), a retry replays it, and only one record is left in the store.", both, testNestedOnce},
	{"NestedInnerLeased", "A per-route Leased under a global install runs the handler in leased mode, outside the outer layer's transaction (in one of its own for its local writes, on a TxStore), and its answer is recorded and replayed.", both, testNestedLeased},
	{"NestedInnerRetention", "A per-route Retention under a global install decides when the record expires: after it the same key runs again.", both, testNestedRetention},
	{"NestedInnerScope", "A per-route Scope under a global install is the record's scope (two routes sharing it share records: the other route's path is a different request, 422); nothing is recorded under the outer layer's scope.", both, testNestedScope},
	{"NestedInFlight", "Under a nested install a duplicate of a running request gets a 409 in-progress; the first request gets its handler's answer, which retries then replay.", both, testNestedInFlight},
	{"NestedPanic", "A panic under a nested install propagates to the outer recovery exactly once and releases the record: a retry runs again.", both, testNestedPanic},
	{"NestedLeasedStream", "In leased mode a handler that flushes under a nested install streams its whole answer to the first client; a duplicate gets the recorded status with a response-not-kept problem document.", leased, testNestedStream},
	{"LateBodyReader", "Under a nested install, a handler behind http.TimeoutHandler that reads the request body after the timeout answered the client, while other requests run, reads its own request's body whole and never another request's bytes.", both, testLateBodyReader},
	{"NestedPassThroughRefused", "When the inner layer's options would pass a request the outer layer protects through (a method it does not cover), the request is refused with a 500 not-protected problem: never run unprotected, never under the outer layer's given-up attempt.", both, testNestedPassThroughRefused},
	{"NestedFingerprintRefused", "A per-route Fingerprint under a global install would make the outer layer compare its own fingerprint with the record (a false 422 on every retry): the request is refused with a 500 not-protected problem and the handler does not run.", both, testNestedFingerprintRefused},
	{"NestedWaitInFlightRefused", "A per-route WaitInFlight under a global install would be ignored by the outer layer (its 409 comes first): the request is refused with a 500 not-protected problem and the handler does not run.", both, testNestedWaitRefused},
	{"NestedKeyOptionalRefused", "A per-route KeyOptional under a global install would be ignored by the outer layer (its 400 for a missing key comes first): a request with a key is refused with a 500 not-protected problem and the handler does not run.", both, testNestedKeyOptionalRefused},
	{"RouterAnswersUntouched", "Requests the router rejects itself (unknown path: 404; known path, wrong method: 405 with Allow) get the router's answer, with or without a key, on every retry, never a problem document of the middleware, never a replay.", both, testRouterAnswers},
}

func testNestedOnce(t *testing.T, x *harness) {
	var n atomic.Int32
	var mu sync.Mutex
	var info core.AttemptInfo
	var found bool
	x.start(nil, Route{Method: "POST", Pattern: "/orders", Handler: func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		info, found = core.AttemptFrom(r.Context())
		mu.Unlock()
		writeOrder(w, r, int(n.Add(1)))
	}})

	first := x.do(post("/orders", orderJSON, "k1"))
	wantOriginal(t, first, http.StatusCreated, orderBody(1, "alice", orderJSON))
	for range 2 {
		wantReplay(t, first, x.do(post("/orders", orderJSON, "k1")))
	}
	wantCalls(t, &n, 1)
	mu.Lock()
	defer mu.Unlock()
	if !found || info.Identity.Scope != "" {
		t.Errorf("the handler ran with attempt %+v (found %v), want one for the empty scope", info, found)
	}
	if got := x.count(); got != 1 {
		t.Errorf("%d records in the store, want 1 (the outer layer must record nothing)", got)
	}
}

func testNestedLeased(t *testing.T, x *harness) {
	var n atomic.Int32
	var mu sync.Mutex
	var info core.AttemptInfo
	var inTx bool
	x.start(nil, Route{Method: "POST", Pattern: "/payments", Options: []core.RouteOption{core.Leased()}, Handler: func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		info, _ = core.AttemptFrom(r.Context())
		if ts, ok := x.store.(store.TxStore); ok {
			inTx = ts.InTx(r.Context())
		}
		mu.Unlock()
		writeOrder(w, r, int(n.Add(1)))
	}})

	first := x.do(post("/payments", orderJSON, "k1"))
	wantOriginal(t, first, http.StatusCreated, orderBody(1, "alice", orderJSON))
	wantReplay(t, first, x.do(post("/payments", orderJSON, "k1")))
	wantCalls(t, &n, 1)
	mu.Lock()
	defer mu.Unlock()
	if info.Atomic {
		t.Errorf("the handler ran with Atomic=%v (in a transaction: %v); the inner Leased wants leased mode", info.Atomic, inTx)
	}
	// In a transaction or not (the leased attempt's own, for its local
	// writes, when the store has transactions), never the outer layer's:
	// that one was rolled back when the inner layer took over, and the
	// outer layer recorded nothing (one record, replayed above).
}

func testNestedRetention(t *testing.T, x *harness) {
	var n atomic.Int32
	x.start(nil, Route{Method: "POST", Pattern: "/orders", Options: []core.RouteOption{core.Retention(time.Hour)}, Handler: orderHandler(&n)})

	first := x.do(post("/orders", orderJSON, "k1"))
	wantOriginal(t, first, http.StatusCreated, orderBody(1, "alice", orderJSON))
	x.clock.Advance(time.Hour - time.Minute)
	wantReplay(t, first, x.do(post("/orders", orderJSON, "k1")))
	x.clock.Advance(2 * time.Minute)
	again := x.do(post("/orders", orderJSON, "k1"))
	wantOriginal(t, again, http.StatusCreated, orderBody(2, "alice", orderJSON))
	wantReplay(t, again, x.do(post("/orders", orderJSON, "k1")))
	wantCalls(t, &n, 2)
}

func testNestedScope(t *testing.T, x *harness) {
	var na, nb atomic.Int32
	scope := []core.RouteOption{core.Scope("create-order")}
	x.start(nil,
		Route{Method: "POST", Pattern: "/orders", Options: scope, Handler: orderHandler(&na)},
		Route{Method: "POST", Pattern: "/v2/orders", Options: scope, Handler: orderHandler(&nb)},
	)

	first := x.do(post("/orders", orderJSON, "k1"))
	wantOriginal(t, first, http.StatusCreated, orderBody(1, "alice", orderJSON))
	wantReplay(t, first, x.do(post("/orders", orderJSON, "k1")))
	// The shared scope means one record: the same key on the other route
	// is another request (another path) for it, a 422, not a new order.
	wantProblem(t, x.do(post("/v2/orders", orderJSON, "k1")), http.StatusUnprocessableEntity, "key-reused")
	wantCalls(t, &na, 1)
	wantCalls(t, &nb, 0)
	// The outer layer has no Scope option: its scope is the empty one.
	outer := store.Identity{Caller: "alice", Scope: "", Key: "k1"}.ID()
	if _, err := x.records.Get(context.Background(), outer, x.clock.Now()); !errors.Is(err, core.ErrNotFound) {
		t.Errorf("the outer layer's (empty) scope has a record (err %v): the outer layer must record nothing", err)
	}
	id := store.Identity{Caller: "alice", Scope: "create-order", Key: "k1"}.ID()
	if _, err := x.records.Get(context.Background(), id, x.clock.Now()); err != nil {
		t.Errorf("no record under the inner scope create-order: %v", err)
	}
}

func testNestedInFlight(t *testing.T, x *harness) {
	var n atomic.Int32
	g := x.gate()
	x.start(nil, heldOrders(&n, g))

	firstCh := x.goDo(post("/orders", orderJSON, "k1"))
	x.waitEntered(g, "first request")
	dup := x.await(x.goDo(post("/orders", orderJSON, "k1")), "duplicate while the first is in flight")
	wantProblem(t, dup, http.StatusConflict, "in-progress")
	wantRetryAfter(t, dup)

	g.open()
	first := x.await(firstCh, "first request")
	wantOriginal(t, first, http.StatusCreated, orderBody(1, "alice", orderJSON))
	wantReplay(t, first, x.do(post("/orders", orderJSON, "k1")))
	wantCalls(t, &n, 1)
}

func testNestedPanic(t *testing.T, x *harness) {
	var n atomic.Int32
	boom := panicValue{"scenario: nested boom"}
	x.start(nil, Route{Method: "POST", Pattern: "/orders", Options: []core.RouteOption{core.Retention(time.Hour)}, Handler: firstThen(&n, func(w http.ResponseWriter, r *http.Request) {
		panic(boom)
	})})

	res := x.do(post("/orders", orderJSON, "k1"))
	wantOriginal(t, res, http.StatusInternalServerError, "recovered by the suite")
	wantRecovered(t, x, boom)
	retry := x.do(post("/orders", orderJSON, "k1"))
	wantOriginal(t, retry, http.StatusCreated, orderBody(2, "alice", orderJSON))
	wantReplay(t, retry, x.do(post("/orders", orderJSON, "k1")))
	wantCalls(t, &n, 2)
}

func testNestedStream(t *testing.T, x *harness) {
	var n atomic.Int32
	var flushErr atomic.Value
	x.start(nil, Route{Method: "POST", Pattern: "/stream", Options: []core.RouteOption{core.Retention(time.Hour)}, Handler: streamHandler(&n, &flushErr)})

	wantOriginal(t, x.do(post("/stream", orderJSON, "k1")), http.StatusCreated, "part 1;part 2")
	if err := flushErr.Load(); err != nil {
		t.Fatalf("Flush through both layers failed: %v", err)
	}
	dup := x.do(post("/stream", orderJSON, "k1"))
	wantProblem(t, dup, http.StatusCreated, "response-not-kept")
	wantCalls(t, &n, 1)
}

// testRouterAnswers checks that the router's own rejections pass the
// middleware untouched. Routers differ in what they answer for a known
// path with a wrong method (405 with Allow on most; Gin answers 404
// unless HandleMethodNotAllowed is set), so the scenario accepts 404 or
// 405 there, and checks that every request gets the same answer.
func testRouterAnswers(t *testing.T, x *harness) {
	var n atomic.Int32
	x.start(nil, Route{Method: "GET", Pattern: "/orders/{id}", Handler: func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		_, _ = io.WriteString(w, "order")
	}})

	for _, c := range []struct {
		name, method, path string
		want               []int
	}{
		{"unknown path", http.MethodPost, "/nowhere", []int{http.StatusNotFound}},
		{"unknown path, PATCH", http.MethodPatch, "/nowhere/7", []int{http.StatusNotFound}},
		{"wrong method", http.MethodPost, "/orders/7", []int{http.StatusMethodNotAllowed, http.StatusNotFound}},
		{"wrong method, PATCH", http.MethodPatch, "/orders/7", []int{http.StatusMethodNotAllowed, http.StatusNotFound}},
	} {
		t.Run(c.name, func(t *testing.T) {
			var first result
			for i, key := range []string{"", "k1", "k1", "k1"} {
				res := x.do(newRequest(c.method, c.path, orderJSON, key))
				what := fmt.Sprintf("request %d (key %q)", i+1, key)
				if res.Status != c.want[0] && (len(c.want) < 2 || res.Status != c.want[1]) {
					t.Fatalf("%s: status %d, want the router's %v; response: %v", what, res.Status, c.want, res)
				}
				if res.replayed() {
					t.Errorf("%s: the router's answer was replayed", what)
				}
				if res.Status == http.StatusMethodNotAllowed && res.Header.Get("Allow") == "" {
					t.Errorf("%s: 405 without Allow", what)
				}
				if i == 0 {
					first = res
					continue
				}
				if res.Status != first.Status || res.Body != first.Body || res.Header.Get("Allow") != first.Header.Get("Allow") {
					t.Errorf("%s: %v, want the router's answer as without a key: %v", what, res, first)
				}
			}
		})
	}
	wantCalls(t, &n, 0)
	if got := x.count(); got != 0 {
		t.Errorf("%d records in the store after the router's own answers, want 0", got)
	}
	if evs := x.observed(); len(evs) != 0 {
		t.Errorf("the router's own answers reported %d decisions (the first: %s, route %q), want none", len(evs), evs[0].Decision, evs[0].Route)
	}
}

func testNestedPassThroughRefused(t *testing.T, x *harness) {
	testNestedRefused(t, x, core.Methods("PUT"))
}

// testNestedRefused: a nested install whose inner options the outer layer
// would contradict (it decides duplicates, mismatches and missing keys
// before the inner layer runs) is refused loudly, not run with half its
// options: every request with a key gets 500 not-protected, the handler
// never runs, and nothing is recorded.
func testNestedRefused(t *testing.T, x *harness, opt core.RouteOption) {
	var n atomic.Int32
	x.start(nil, Route{Method: "POST", Pattern: "/orders", Options: []core.RouteOption{opt}, Handler: orderHandler(&n)})
	for range 2 {
		wantProblem(t, x.do(post("/orders", orderJSON, "k1")), http.StatusInternalServerError, "not-protected")
	}
	wantCalls(t, &n, 0)
}

func testNestedFingerprintRefused(t *testing.T, x *harness) {
	testNestedRefused(t, x, core.Fingerprint(core.FingerprintFields("amount")))
}

func testNestedWaitRefused(t *testing.T, x *harness) {
	testNestedRefused(t, x, core.WaitInFlight(time.Minute))
}

func testNestedKeyOptionalRefused(t *testing.T, x *harness) {
	testNestedRefused(t, x, core.KeyOptional())
}
