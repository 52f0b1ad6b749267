package scenario

import (
	"net/http"
	"sync/atomic"
	"testing"

	"github.com/idemkit/idem/core"
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
