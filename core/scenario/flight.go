package scenario

import (
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/core"
)

// Scenarios of requests in flight and of callers.

// heldOrders returns a route whose first execution holds at g before
// answering like orderHandler.
func heldOrders(n *atomic.Int32, g *gate, opts ...core.RouteOption) Route {
	return Route{Method: "POST", Pattern: "/orders", Options: opts, Handler: func(w http.ResponseWriter, r *http.Request) {
		i := n.Add(1)
		if i == 1 {
			g.hold()
		}
		writeOrder(w, r, int(i))
	}}
}

func testInFlightReject(t *testing.T, x *harness) {
	var n atomic.Int32
	g := x.gate()
	x.start(nil, heldOrders(&n, g))

	firstCh := x.goDo(post("/orders", orderJSON, "k1"))
	x.waitEntered(g, "first request")

	// The first is held until the duplicate has answered: an engine that
	// waits for the first fails here (after the failsafe) instead of
	// answering at once.
	dup := x.await(x.goDo(post("/orders", orderJSON, "k1")), "duplicate while the first is in flight")
	wantProblem(t, dup, http.StatusConflict, "in-progress")
	wantRetryAfter(t, dup)
	if dup.replayed() {
		t.Errorf("a 409 carries %s", core.HeaderReplayed)
	}

	g.open()
	first := x.await(firstCh, "first request")
	wantOriginal(t, first, http.StatusCreated, orderBody(1, "alice", orderJSON))
	wantReplay(t, first, x.do(post("/orders", orderJSON, "k1")))
	wantCalls(t, &n, 1)
}

func testInFlightWaitReplay(t *testing.T, x *harness) {
	var n atomic.Int32
	g := x.gate()
	// The clock stands still, so the bound never passes.
	x.start(nil, heldOrders(&n, g, core.WaitInFlight(time.Minute)))

	firstCh := x.goDo(post("/orders", orderJSON, "k1"))
	x.waitEntered(g, "first request")
	dupCh := x.goDo(post("/orders", orderJSON, "k1"))
	x.waitBlocked("duplicate")

	select {
	case res := <-dupCh:
		t.Fatalf("the duplicate answered while the first was in flight: %v", res)
	default:
	}
	g.open()
	first := x.await(firstCh, "first request")
	wantOriginal(t, first, http.StatusCreated, orderBody(1, "alice", orderJSON))
	wantReplay(t, first, x.await(dupCh, "waiting duplicate"))
	wantCalls(t, &n, 1)
}

func testInFlightWaitTimeout(t *testing.T, x *harness) {
	var n atomic.Int32
	g := x.gate()
	x.start(nil, heldOrders(&n, g, core.WaitInFlight(time.Second)))

	firstCh := x.goDo(post("/orders", orderJSON, "k1"))
	x.waitEntered(g, "first request")
	// From now on every reading of the clock moves it 300ms on: the
	// duplicate's bound passes after a few readings (the first request
	// reads no clock while it is held, and its 30s lease stays live).
	x.clock.Step(300 * time.Millisecond)
	dup := x.await(x.goDo(post("/orders", orderJSON, "k1")), "duplicate waiting for the bound")
	x.clock.Step(0)
	wantProblem(t, dup, http.StatusConflict, "in-progress")
	wantRetryAfter(t, dup)

	g.open()
	first := x.await(firstCh, "first request")
	wantOriginal(t, first, http.StatusCreated, orderBody(1, "alice", orderJSON))
	wantCalls(t, &n, 1)
}

func testConcurrent(t *testing.T, x *harness) {
	const clients = 50
	var n atomic.Int32
	x.startTCP(nil, Route{Method: "POST", Pattern: "/orders", Handler: func(w http.ResponseWriter, r *http.Request) {
		i := n.Add(1)
		// Stay in flight until a duplicate has met the record (or a
		// while), so that duplicates overlap the execution.
		select {
		case <-x.hooks.blocked:
		case <-time.After(time.Second):
		}
		writeOrder(w, r, int(i))
	}})

	var wg sync.WaitGroup
	start := make(chan struct{})
	results := make([]result, clients)
	for i := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			results[i] = x.do(post("/orders", orderJSON, "k1"))
		}()
	}
	close(start)
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(failsafe):
		t.Fatal("the concurrent requests did not all answer")
	}

	wantCalls(t, &n, 1)
	body := orderBody(1, "alice", orderJSON)
	var originals, replays, busy int
	for i, res := range results {
		switch {
		case res.Err != nil:
			t.Errorf("request %d: %v", i, res.Err)
		case res.Status == http.StatusCreated && res.Body == body && res.replayed():
			replays++
		case res.Status == http.StatusCreated && res.Body == body:
			originals++
		case res.Status == http.StatusConflict:
			wantProblem(t, res, http.StatusConflict, "in-progress")
			wantRetryAfter(t, res)
			busy++
		default:
			t.Errorf("request %d: unexpected answer %v", i, res)
		}
	}
	if originals != 1 {
		t.Errorf("%d answers came from an execution, want 1", originals)
	}
	t.Logf("%d executed, %d replayed, %d in progress", originals, replays, busy)
}

func testCallerIsolation(t *testing.T, x *harness) {
	var n atomic.Int32
	g := x.gate()
	x.start(nil, Route{Method: "POST", Pattern: "/orders", Handler: func(w http.ResponseWriter, r *http.Request) {
		i := n.Add(1)
		if r.Header.Get("X-Caller") == "carol" {
			g.hold()
		}
		writeOrder(w, r, int(i))
	}})

	// Completed under alice: bob gets his own execution, same body or not.
	alice := x.do(post("/orders", orderJSON, "shared"))
	wantOriginal(t, alice, http.StatusCreated, orderBody(1, "alice", orderJSON))
	bob := x.do(post("/orders", orderJSON, "shared").as("bob"))
	wantOriginal(t, bob, http.StatusCreated, orderBody(2, "bob", orderJSON))
	other := `{"amount":5,"currency":"USD"}`
	dave := x.do(post("/orders", other, "shared").as("dave"))
	wantOriginal(t, dave, http.StatusCreated, orderBody(3, "dave", other))

	// In flight under carol: erin is not told 409.
	carolCh := x.goDo(post("/orders", orderJSON, "busy").as("carol"))
	x.waitEntered(g, "carol's request")
	erin := x.await(x.goDo(post("/orders", orderJSON, "busy").as("erin")), "erin's request")
	wantOriginal(t, erin, http.StatusCreated, orderBody(5, "erin", orderJSON))
	g.open()
	carol := x.await(carolCh, "carol's request")
	wantOriginal(t, carol, http.StatusCreated, orderBody(4, "carol", orderJSON))

	// Every caller replays its own answer.
	wantReplay(t, alice, x.do(post("/orders", orderJSON, "shared")))
	wantReplay(t, bob, x.do(post("/orders", orderJSON, "shared").as("bob")))
	wantReplay(t, dave, x.do(post("/orders", other, "shared").as("dave")))
	wantReplay(t, carol, x.do(post("/orders", orderJSON, "busy").as("carol")))
	wantReplay(t, erin, x.do(post("/orders", orderJSON, "busy").as("erin")))
	wantCalls(t, &n, 5)
}

func testNoCaller(t *testing.T, x *harness) {
	var n atomic.Int32
	x.start(nil, Route{Method: "POST", Pattern: "/orders", Handler: orderHandler(&n)})

	wantProblem(t, x.do(post("/orders", orderJSON, "k1").as("")), http.StatusUnauthorized, "unauthenticated")
	wantProblem(t, x.do(post("/orders", orderJSON, "k1").set("X-Caller", "")), http.StatusUnauthorized, "unauthenticated")
	wantCalls(t, &n, 0)
	// The refused request left nothing behind.
	wantOriginal(t, x.do(post("/orders", orderJSON, "k1")), http.StatusCreated, orderBody(1, "alice", orderJSON))
}
