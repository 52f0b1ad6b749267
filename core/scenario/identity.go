package scenario

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/store"
)

// Scenarios of request identity: the default fingerprint covers the whole
// request as the handler sees it (method, concrete path, query, body), so
// one key sent with another request is a 422, never a replay of the other
// request's answer.

// wantMismatch fails unless res is a 422 key-reused problem that is not a
// replay.
func wantMismatch(t *testing.T, res result, what string) {
	t.Helper()
	wantProblem(t, res, http.StatusUnprocessableEntity, "key-reused")
	if res.replayed() {
		t.Errorf("%s: a 422 carries %s", what, core.HeaderReplayed)
	}
	if t.Failed() {
		t.Fatalf("%s: want a 422 key-reused", what)
	}
}

func testOtherResource(t *testing.T, x *harness) {
	var n atomic.Int32
	x.start(nil, Route{Method: "POST", Pattern: "/orders/{id}/payments", Handler: orderHandler(&n)})

	first := x.do(post("/orders/1/payments", orderJSON, "k1"))
	wantOriginal(t, first, http.StatusCreated, orderBody(1, "alice", orderJSON))
	wantMismatch(t, x.do(post("/orders/2/payments", orderJSON, "k1")), "the same key and body for order 2")
	wantCalls(t, &n, 1)
	// The record still belongs to order 1, and order 2 can be paid with a
	// key of its own.
	wantReplay(t, first, x.do(post("/orders/1/payments", orderJSON, "k1")))
	wantOriginal(t, x.do(post("/orders/2/payments", orderJSON, "k2")), http.StatusCreated, orderBody(2, "alice", orderJSON))
	wantCalls(t, &n, 2)
}

func testOtherQuery(t *testing.T, x *harness) {
	var n atomic.Int32
	x.start(nil, Route{Method: "POST", Pattern: "/orders", Handler: orderHandler(&n)})

	dry := x.do(post("/orders?dry_run=true", orderJSON, "k1"))
	wantOriginal(t, dry, http.StatusCreated, orderBody(1, "alice", orderJSON))
	wantMismatch(t, x.do(post("/orders?dry_run=false", orderJSON, "k1")), "dry_run=false after dry_run=true")
	wantMismatch(t, x.do(post("/orders", orderJSON, "k1")), "no query after dry_run=true")
	wantReplay(t, dry, x.do(post("/orders?dry_run=true", orderJSON, "k1")))
	wantCalls(t, &n, 1)

	// Parameters in another order, and escaped differently, are the same
	// query; repeated values in another order are not.
	q := x.do(post("/orders?a=1&b=x+y&tag=red&tag=blue", orderJSON, "k2"))
	wantOriginal(t, q, http.StatusCreated, orderBody(2, "alice", orderJSON))
	wantReplay(t, q, x.do(post("/orders?tag=red&b=x%20y&tag=blue&a=1", orderJSON, "k2")))
	wantMismatch(t, x.do(post("/orders?a=1&b=x+y&tag=blue&tag=red", orderJSON, "k2")), "repeated values in another order")
	wantCalls(t, &n, 2)
}

func testOtherMethod(t *testing.T, x *harness) {
	var n atomic.Int32
	scope := []core.RouteOption{core.Scope("order")}
	x.start(nil,
		Route{Method: "POST", Pattern: "/orders", Options: scope, Handler: orderHandler(&n)},
		Route{Method: "PATCH", Pattern: "/orders", Options: scope, Handler: orderHandler(&n)},
	)

	first := x.do(post("/orders", orderJSON, "k1"))
	wantOriginal(t, first, http.StatusCreated, orderBody(1, "alice", orderJSON))
	wantMismatch(t, x.do(newRequest(http.MethodPatch, "/orders", orderJSON, "k1")), "PATCH after POST under one scope")
	wantCalls(t, &n, 1)
}

func testCaseCollision(t *testing.T, x *harness) {
	var n atomic.Int32
	x.start(nil, Route{Method: "POST", Pattern: "/orders", Handler: orderHandler(&n)})

	// encoding/json matches names case-insensitively and the last wins:
	// the first body orders 9, the second 1.
	nine := `{"item":"tea","quantity":1,"Quantity":9}`
	first := x.do(post("/orders", nine, "k1"))
	wantOriginal(t, first, http.StatusCreated, orderBody(1, "alice", nine))
	wantMismatch(t, x.do(post("/orders", `{"item":"tea","Quantity":9,"quantity":1}`, "k1")), "colliding names in another order")
	wantReplay(t, first, x.do(post("/orders", "{ \"quantity\": 1, \"Quantity\": 9, \"item\": \"tea\" }", "k1")))

	dup := x.do(post("/orders", `{"a":1,"a":2}`, "k2"))
	wantOriginal(t, dup, http.StatusCreated, orderBody(2, "alice", `{"a":1,"a":2}`))
	wantMismatch(t, x.do(post("/orders", `{"a":2,"a":1}`, "k2")), "a repeated name in another order")
	wantCalls(t, &n, 2)
}

// testKeyOnAnotherRoute: a key is unique within its caller, whatever the
// route: the same key sent to another route is a key reused for another
// request (the fingerprint holds the method and the concrete path).
func testKeyOnAnotherRoute(t *testing.T, x *harness) {
	var orders, cancels atomic.Int32
	x.start(nil,
		Route{Method: "POST", Pattern: "/orders", Handler: orderHandler(&orders)},
		Route{Method: "POST", Pattern: "/orders/{id}/cancel", Handler: orderHandler(&cancels)},
	)

	first := x.do(post("/orders", orderJSON, "k1"))
	wantOriginal(t, first, http.StatusCreated, orderBody(1, "alice", orderJSON))
	wantMismatch(t, x.do(post("/orders/1/cancel", orderJSON, "k1")), "POST /orders/1/cancel with the key of POST /orders")
	wantReplay(t, first, x.do(post("/orders", orderJSON, "k1")))
	wantCalls(t, &orders, 1)
	wantCalls(t, &cancels, 0)
	// The cancel runs under a key of its own.
	wantOriginal(t, x.do(post("/orders/1/cancel", orderJSON, "k2")), http.StatusCreated, orderBody(1, "alice", orderJSON))
	wantCalls(t, &cancels, 1)
}

// testScopeEmptyByDefault: without a Scope option the scope is empty, for
// every route and every concrete path: /orders/1/refunds and
// /orders/2/refunds with one key address one record, and the second,
// another request, gets a 422 from it.
func testScopeEmptyByDefault(t *testing.T, x *harness) {
	var n atomic.Int32
	var mu sync.Mutex
	var scopes []string
	x.start(nil, Route{Method: "POST", Pattern: "/orders/{id}/refunds", Handler: func(w http.ResponseWriter, r *http.Request) {
		i := n.Add(1)
		if info, ok := core.AttemptFrom(r.Context()); ok {
			mu.Lock()
			scopes = append(scopes, info.Identity.Scope)
			mu.Unlock()
		}
		writeOrder(w, r, int(i))
	}})

	first := x.do(post("/orders/1/refunds", orderJSON, "k1"))
	wantOriginal(t, first, http.StatusCreated, orderBody(1, "alice", orderJSON))
	wantMismatch(t, x.do(post("/orders/2/refunds", orderJSON, "k1")), "the same key for order 2")
	wantReplay(t, first, x.do(post("/orders/1/refunds", orderJSON, "k1")))
	wantCalls(t, &n, 1)
	other := x.do(post("/orders/2/refunds", orderJSON, "k2"))
	wantOriginal(t, other, http.StatusCreated, orderBody(2, "alice", orderJSON))
	wantCalls(t, &n, 2)

	mu.Lock()
	defer mu.Unlock()
	for _, s := range scopes {
		if s != "" {
			t.Errorf("the attempt's scope is %q: without a Scope option it must be empty (never the route or the path)", s)
		}
	}
	for _, ev := range x.observed() {
		if ev.Scope != "" {
			t.Errorf("a %s decision reports the scope %q, want the empty scope", ev.Decision, ev.Scope)
		}
		// The route label is bounded: the route pattern, never the path.
		if strings.Contains(ev.Route, "/1/") || strings.Contains(ev.Route, "/2/") {
			t.Errorf("a %s decision is labelled with the route %q: the concrete path, want the route pattern", ev.Decision, ev.Route)
		}
		if x.labelled && ev.Route != "/orders/{id}/refunds" && ev.Route != "/orders/:id/refunds" {
			t.Errorf("a %s decision is labelled with the route %q, want the route pattern (/orders/{id}/refunds as the router spells it)", ev.Decision, ev.Route)
		}
	}
	if _, err := x.records.Get(context.Background(), store.Identity{Caller: "alice", Key: "k1"}.ID(), x.clock.Now()); err != nil {
		t.Errorf("no record under (alice, \"\", k1): %v", err)
	}
}
