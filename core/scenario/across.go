package scenario

import (
	"net/http"
	"slices"
	"sync/atomic"
	"testing"
)

// Scenarios of one key sent through two routers on one store: the
// replicas of a service during a rolling migration from one router to
// another (Gin's "/orders/:id/payments" next to chi's
// "/orders/{id}/payments"), or during a rolling deploy that renames a
// route parameter. The identity of a request is (caller, scope, key),
// never the router's spelling of the route (docs/contract.md, section 1),
// so the two replicas share every record.

// RunAcross runs the cross-router scenarios: a and b each build a router
// (per route, as for Run) for an engine of its own over one shared store,
// as two replicas of one service would. a and b may be the same factory
// (the renamed-parameter scenario then still registers the routes under
// two spellings) or the factories of two adapters.
func RunAcross(t *testing.T, a, b Factory, opts ...Option) {
	t.Helper()
	if a == nil || b == nil {
		t.Fatal("scenario.RunAcross: nil Factory")
	}
	list := slices.Clone(acrossScenarios)
	for i := range list {
		fn := list[i].fn
		list[i].fn = func(t *testing.T, x *harness) {
			x.other = builder(b)
			fn(t, x)
		}
	}
	run(t, list, builder(a), true, opts)
}

// acrossScenarios is the suite RunAcross runs.
var acrossScenarios = []scenario{
	{"OneKeyTwoRouters", "The same key sent to one route through two routers (two replicas on one store) runs the handler once: the second router replays the first one's answer.", both, testAcrossReplay},
	{"RenamedParameter", "A route whose path parameter is renamed (/orders/{id}/payments on one replica, /orders/{orderID}/payments on the other) is the same route: the same key replays across them.", both, testAcrossRenamed},
	{"InFlightAcrossRouters", "A duplicate through the other router of a request still running gets a 409 in-progress at once; the handler runs once.", both, testAcrossInFlight},
	{"OtherRouteAcrossRouters", "POST /orders through one router, then POST /orders/1/cancel with the same key through the other, is a key reused for another request: a 422, and the cancel does not run.", both, testAcrossOtherRoute},
}

// startAcross builds the first router with routesA (x.h, x.engine) and
// the second, with an engine of its own over the same store, with routesB.
func (x *harness) startAcross(routesA, routesB []Route) (b http.Handler) {
	x.t.Helper()
	if x.other == nil {
		x.t.Fatal("scenario: startAcross outside RunAcross")
	}
	x.start(nil, routesA...)
	_, b = x.serve(x.other, nil, routesB)
	return b
}

func payments(n *atomic.Int32, pattern string) Route {
	return Route{Method: "POST", Pattern: pattern, Handler: orderHandler(n)}
}

func testAcrossReplay(t *testing.T, x *harness) {
	var n atomic.Int32
	b := x.startAcross(
		[]Route{payments(&n, "/orders/{id}/payments")},
		[]Route{payments(&n, "/orders/{id}/payments")},
	)
	first := x.do(post("/orders/1/payments", orderJSON, "k1"))
	wantOriginal(t, first, http.StatusCreated, orderBody(1, "alice", orderJSON))
	wantReplay(t, first, x.doOn(b, post("/orders/1/payments", orderJSON, "k1")))
	wantReplay(t, first, x.do(post("/orders/1/payments", orderJSON, "k1")))
	wantCalls(t, &n, 1)
	// A first request through the second router is replayed by the first.
	second := x.doOn(b, post("/orders/2/payments", orderJSON, "k2"))
	wantOriginal(t, second, http.StatusCreated, orderBody(2, "alice", orderJSON))
	wantReplay(t, second, x.do(post("/orders/2/payments", orderJSON, "k2")))
	wantCalls(t, &n, 2)
}

func testAcrossRenamed(t *testing.T, x *harness) {
	var n atomic.Int32
	b := x.startAcross(
		[]Route{payments(&n, "/orders/{id}/payments")},
		[]Route{payments(&n, "/orders/{orderID}/payments")},
	)
	first := x.do(post("/orders/7/payments", orderJSON, "k1"))
	wantOriginal(t, first, http.StatusCreated, orderBody(1, "alice", orderJSON))
	wantReplay(t, first, x.doOn(b, post("/orders/7/payments", orderJSON, "k1")))
	wantCalls(t, &n, 1)
	// Still bound to order 7: another order under the key is a 422.
	wantMismatch(t, x.doOn(b, post("/orders/8/payments", orderJSON, "k1")), "the key of order 7 for order 8, on the renamed route")
	wantCalls(t, &n, 1)
}

func testAcrossInFlight(t *testing.T, x *harness) {
	var n atomic.Int32
	g := x.gate()
	held := heldOrders(&n, g)
	held.Pattern = "/orders/{id}/payments"
	b := x.startAcross([]Route{held}, []Route{held})

	firstCh := x.goDo(post("/orders/1/payments", orderJSON, "k1"))
	x.waitEntered(g, "first request")
	dupCh := make(chan result, 1)
	x.wg.Add(1)
	go func() {
		defer x.wg.Done()
		dupCh <- x.doOn(b, post("/orders/1/payments", orderJSON, "k1"))
	}()
	dup := x.await(dupCh, "duplicate through the other router while the first is in flight")
	wantProblem(t, dup, http.StatusConflict, "in-progress")
	wantRetryAfter(t, dup)

	g.open()
	first := x.await(firstCh, "first request")
	wantOriginal(t, first, http.StatusCreated, orderBody(1, "alice", orderJSON))
	wantReplay(t, first, x.doOn(b, post("/orders/1/payments", orderJSON, "k1")))
	wantCalls(t, &n, 1)
}

func testAcrossOtherRoute(t *testing.T, x *harness) {
	var orders, cancels atomic.Int32
	b := x.startAcross(
		[]Route{payments(&orders, "/orders")},
		[]Route{payments(&orders, "/orders"), payments(&cancels, "/orders/{id}/cancel")},
	)
	first := x.do(post("/orders", orderJSON, "k1"))
	wantOriginal(t, first, http.StatusCreated, orderBody(1, "alice", orderJSON))
	wantMismatch(t, x.doOn(b, post("/orders/1/cancel", orderJSON, "k1")), "POST /orders/1/cancel through the other router with the key of POST /orders")
	wantReplay(t, first, x.doOn(b, post("/orders", orderJSON, "k1")))
	wantCalls(t, &orders, 1)
	wantCalls(t, &cancels, 0)
}
