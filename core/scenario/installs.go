package scenario

import (
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/idemkit/idem/core"
)

// Scenarios of what sits around the middleware in a router: a middleware
// before it that consumed the body, routes a global install skips, and the
// framework's own recovery middleware outside it. Each adapter's tests used
// to check these on their own, one copy per adapter.

// RecoveredFactory builds a router as a GlobalFactory does (the adapter's
// middleware for engine e installed once for the whole router, no route
// options), with the framework's own recovery middleware installed before
// it (gin.Recovery, Echo's middleware.Recover, chi's middleware.Recoverer,
// Fiber's recover.New): a panic in a handler goes through the adapter's
// middleware and is answered by that recovery, inside the router.
type RecoveredFactory func(t *testing.T, e *core.Engine, routes []Route) http.Handler

// RunRecovered runs the scenarios of a handler that panics under the
// framework's own recovery middleware, through f.
func RunRecovered(t *testing.T, f RecoveredFactory, opts ...Option) {
	t.Helper()
	if f == nil {
		t.Fatal("scenario.RunRecovered: nil RecoveredFactory")
	}
	run(t, recoveredScenarios, builder(f), true, opts)
}

// recoveredScenarios is the suite RunRecovered runs.
var recoveredScenarios = []scenario{
	{"FrameworkRecoveryReleases", "Under the framework's own recovery middleware a panicking handler gets the recovery's 500 (never a replay, and the panic does not leave the router), the adapter has given the framework its own writer back, and the record is released: the retry runs and its answer is replayed.", both, testRecoveredReleases},
	{"FrameworkRecoveryAfterEffect", "Under the framework's own recovery middleware a handler that panics after core.MarkEffect gets the recovery's 500 and leaves the record indeterminate: a retry replays a 500 problem document and the handler does not run again.", both, testRecoveredAfterEffect},
}

func testRecoveredReleases(t *testing.T, x *harness) {
	var n atomic.Int32
	x.start(nil, Route{Method: "POST", Pattern: "/orders", Handler: firstThen(&n, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, `{"partial":`)
		panic(panicValue{"scenario: boom under the framework's recovery"})
	})})

	res := x.do(post("/orders", orderJSON, "k1"))
	wantStatus(t, res, http.StatusInternalServerError)
	if res.replayed() || strings.Contains(res.Body, `{"partial":`) {
		t.Errorf("the first answer is %v: want the recovery's own 500, not a replay and not the handler's partial body", res)
	}
	if got := x.recovered(); len(got) != 0 {
		t.Errorf("the panic left the router (%v): the framework's recovery should have answered it", got)
	}
	retry := x.do(post("/orders", orderJSON, "k1"))
	wantOriginal(t, retry, http.StatusCreated, orderBody(2, "alice", orderJSON))
	wantReplay(t, retry, x.do(post("/orders", orderJSON, "k1")))
	wantCalls(t, &n, 2)
}

func testRecoveredAfterEffect(t *testing.T, x *harness) {
	var n atomic.Int32
	x.start(nil, Route{Method: "POST", Pattern: "/orders", Handler: firstThen(&n, func(w http.ResponseWriter, r *http.Request) {
		core.MarkEffect(r.Context())
		panic(panicValue{"scenario: the PSP connection broke under the framework's recovery"})
	})})

	wantStatus(t, x.do(post("/orders", orderJSON, "k1")), http.StatusInternalServerError)
	wantIndeterminate(t, x, "")
	wantCalls(t, &n, 1)
}

// testBodyConsumedUpstream: a middleware in front of the adapter's that
// reads the body without restoring it (a logger, a binder), or replaces it
// with http.NoBody, leaves the middleware nothing to fingerprint: the
// request is refused (500 body-consumed, whose detail does not carry the
// server's error text), never fingerprinted as empty and run.
func testBodyConsumedUpstream(t *testing.T, x *harness) {
	var n atomic.Int32
	x.start(nil, Route{Method: "POST", Pattern: "/orders", Handler: orderHandler(&n)})
	router := x.h
	for _, consume := range []func(r *http.Request){
		func(r *http.Request) { _, _ = io.Copy(io.Discard, r.Body) }, // read, not restored
		func(r *http.Request) { r.Body = http.NoBody },               // replaced
	} {
		x.h = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			consume(r)
			router.ServeHTTP(w, r)
		})
		for range 2 {
			p := wantProblem(t, x.do(post("/orders", orderJSON, "k1")), http.StatusInternalServerError, "body-consumed")
			if strings.Contains(p.Detail, "Content-Length") {
				t.Errorf("the problem's detail carries the server's error text: %q", p.Detail)
			}
		}
	}
	wantCalls(t, &n, 0)
}

// testSkippedRoute: a route the global install's skipper leaves out
// (Route.Skip: Config.Skipper, Fiber's Next) runs every time, with or
// without a key, is never replayed and reports no decision; the other
// routes stay protected.
func testSkippedRoute(t *testing.T, x *harness) {
	var orders, hooks atomic.Int32
	x.start(nil,
		Route{Method: "POST", Pattern: "/orders", Handler: orderHandler(&orders)},
		Route{Method: "POST", Pattern: "/webhooks/{provider}", Skip: true, Handler: orderHandler(&hooks)},
	)

	for i, key := range []string{"", "k1", "k1"} {
		res := x.do(post("/webhooks/stripe", orderJSON, key))
		wantOriginal(t, res, http.StatusCreated, orderBody(i+1, "alice", orderJSON))
	}
	wantCalls(t, &hooks, 3)
	if evs := x.observed(); len(evs) != 0 {
		t.Errorf("the skipped route reported %d decisions (the first: %s), want none", len(evs), evs[0].Decision)
	}
	wantProblem(t, x.do(post("/orders", orderJSON, "")), http.StatusBadRequest, "missing-key")
	first := x.do(post("/orders", orderJSON, "k1"))
	wantOriginal(t, first, http.StatusCreated, orderBody(1, "alice", orderJSON))
	wantReplay(t, first, x.do(post("/orders", orderJSON, "k1")))
	wantCalls(t, &orders, 1)
}
