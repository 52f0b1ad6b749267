package scenario

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/seal"
	"github.com/idemkit/idem/core/store"
)

// Scenarios of outcomes (release, 5xx, indeterminate), the response cap,
// methods, store failures, leases, retention, sealing, scopes and the
// handler's context.

// firstThen returns a handler that runs first on its first execution and
// answers like orderHandler afterwards; n counts executions.
func firstThen(n *atomic.Int32, first func(w http.ResponseWriter, r *http.Request)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		i := n.Add(1)
		if i == 1 {
			first(w, r)
			return
		}
		writeOrder(w, r, int(i))
	}
}

func testReleaseStatuses(t *testing.T, x *harness) {
	statuses := []int{http.StatusBadRequest, http.StatusRequestTimeout, http.StatusUnprocessableEntity, http.StatusTooManyRequests}
	calls := map[int]*atomic.Int32{}
	var routes []Route
	for _, status := range statuses {
		n := new(atomic.Int32)
		calls[status] = n
		routes = append(routes, Route{Method: "POST", Pattern: fmt.Sprintf("/r%d", status), Handler: firstThen(n, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Retry-After", "1")
			http.Error(w, http.StatusText(status), status)
		})})
	}
	x.start(nil, routes...)

	for _, status := range statuses {
		// One key per route: a key is unique within its caller, whatever
		// the route (a key of one route sent to the other is a 422).
		path, key := fmt.Sprintf("/r%d", status), fmt.Sprintf("k%d", status)
		wantOriginal(t, x.do(post(path, orderJSON, key)), status, http.StatusText(status)+"\n")
		retry := x.do(post(path, orderJSON, key))
		wantOriginal(t, retry, http.StatusCreated, orderBody(2, "alice", orderJSON))
		wantReplay(t, retry, x.do(post(path, orderJSON, key)))
		wantCalls(t, calls[status], 2)
	}
}

// testAfterEffectKept: once the handler marked an effect nothing releases
// the record. A 400 or 422 is recorded and replayed; a 408 or 429 is
// indeterminate (replayed, never run again); core.Release fails with
// ErrConfig and changes nothing.
func testAfterEffectKept(t *testing.T, x *harness) {
	statuses := []int{http.StatusBadRequest, http.StatusRequestTimeout, http.StatusUnprocessableEntity, http.StatusTooManyRequests}
	calls := map[int]*atomic.Int32{}
	var routes []Route
	for _, status := range statuses {
		n := new(atomic.Int32)
		calls[status] = n
		routes = append(routes, Route{Method: "POST", Pattern: fmt.Sprintf("/e%d", status), Handler: firstThen(n, func(w http.ResponseWriter, r *http.Request) {
			if err := core.MarkEffect(r.Context()); err != nil {
				http.Error(w, err.Error(), 599)
				return
			}
			if status == http.StatusBadRequest {
				if err := core.Release(r.Context()); !errors.Is(err, core.ErrConfig) {
					http.Error(w, fmt.Sprintf("core.Release after MarkEffect: %v, want an error wrapping ErrConfig", err), 599)
					return
				}
			}
			w.Header().Set("Retry-After", "1")
			http.Error(w, http.StatusText(status), status)
		})})
	}
	x.start(nil, routes...)
	for _, status := range statuses {
		path := fmt.Sprintf("/e%d", status)
		key := "k" + path
		first := x.do(post(path, orderJSON, key))
		wantOriginal(t, first, status, http.StatusText(status)+"\n")
		for range 2 {
			wantReplay(t, first, x.do(post(path, orderJSON, key)))
		}
		wantCalls(t, calls[status], 1)
	}
}

func testExplicitRelease(t *testing.T, x *harness) {
	var n400, n201 atomic.Int32
	x.start(nil,
		Route{Method: "POST", Pattern: "/validated", Handler: firstThen(&n400, func(w http.ResponseWriter, r *http.Request) {
			core.Release(r.Context())
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusBadRequest)
			_, _ = io.WriteString(w, `{"error":"unknown account"}`)
		})},
		Route{Method: "POST", Pattern: "/released", Handler: firstThen(&n201, func(w http.ResponseWriter, r *http.Request) {
			core.Release(r.Context())
			writeOrder(w, r, 1)
		})},
	)

	wantOriginal(t, x.do(post("/validated", orderJSON, "k1")), http.StatusBadRequest, `{"error":"unknown account"}`)
	retry := x.do(post("/validated", orderJSON, "k1"))
	wantOriginal(t, retry, http.StatusCreated, orderBody(2, "alice", orderJSON))
	wantReplay(t, retry, x.do(post("/validated", orderJSON, "k1")))
	wantCalls(t, &n400, 2)

	// A key of its own: k1 is bound to /validated's recorded 201.
	wantOriginal(t, x.do(post("/released", orderJSON, "k2")), http.StatusCreated, orderBody(1, "alice", orderJSON))
	wantOriginal(t, x.do(post("/released", orderJSON, "k2")), http.StatusCreated, orderBody(2, "alice", orderJSON))
	wantCalls(t, &n201, 2)
}

// panicValue is what the suite's handlers panic with; the outer recovery
// must receive it unchanged.
type panicValue struct{ msg string }

// wantIndeterminate fails unless two more POST /orders with key k1 get
// the indeterminate record replayed: a 500 problem document (of slug, when
// not empty) with Idempotent-Replayed: true.
func wantIndeterminate(t *testing.T, x *harness, slug string) {
	t.Helper()
	for range 2 {
		res := x.do(post("/orders", orderJSON, "k1"))
		wantProblem(t, res, http.StatusInternalServerError, slug)
		if !res.replayed() {
			t.Errorf("the indeterminate answer lacks %s: true", core.HeaderReplayed)
		}
	}
}

func wantRecovered(t *testing.T, x *harness, v panicValue) {
	t.Helper()
	got := x.recovered()
	if len(got) != 1 || got[0] != v {
		t.Errorf("the outer recovery saw %v, want exactly the handler's panic %v", got, v)
	}
}

func testPanicReleases(t *testing.T, x *harness) {
	var n atomic.Int32
	boom := panicValue{"scenario: boom"}
	x.start(nil, Route{Method: "POST", Pattern: "/orders", Handler: firstThen(&n, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"partial":`)
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

// failWith returns a first execution that answers status after marking an
// effect when effect is set.
func failWith(status int, effect bool) func(w http.ResponseWriter, r *http.Request) {
	return func(w http.ResponseWriter, r *http.Request) {
		if effect {
			core.MarkEffect(r.Context())
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Upstream", "psp")
		w.WriteHeader(status)
		fmt.Fprintf(w, `{"error":"upstream answered %d"}`, status)
	}
}

// test5xxBeforeEffectReleases: a 5xx before MarkEffect (a database that
// is down before the provider was called) means nothing happened yet, in
// either mode: the key is released and the retry runs.
func test5xxBeforeEffectReleases(t *testing.T, x *harness) {
	var n atomic.Int32
	x.start(nil, Route{Method: "POST", Pattern: "/orders", Handler: firstThen(&n, failWith(http.StatusServiceUnavailable, false))})

	wantOriginal(t, x.do(post("/orders", orderJSON, "k1")), http.StatusServiceUnavailable, `{"error":"upstream answered 503"}`)
	retry := x.do(post("/orders", orderJSON, "k1"))
	wantOriginal(t, retry, http.StatusCreated, orderBody(2, "alice", orderJSON))
	wantReplay(t, retry, x.do(post("/orders", orderJSON, "k1")))
	wantCalls(t, &n, 2)
}

// test5xxBeforeThenAfterEffect: a first attempt that fails before any effect
// (released) and a second one that fails after marking one
// (indeterminate): the third request replays the second's answer.
func test5xxBeforeThenAfterEffect(t *testing.T, x *harness) {
	var n atomic.Int32
	x.start(nil, Route{Method: "POST", Pattern: "/orders", Handler: func(w http.ResponseWriter, r *http.Request) {
		switch n.Add(1) {
		case 1:
			failWith(http.StatusInternalServerError, false)(w, r)
		case 2:
			failWith(http.StatusBadGateway, true)(w, r)
		default:
			writeOrder(w, r, int(n.Load()))
		}
	}})

	wantOriginal(t, x.do(post("/orders", orderJSON, "k1")), http.StatusInternalServerError, `{"error":"upstream answered 500"}`)
	second := x.do(post("/orders", orderJSON, "k1"))
	wantOriginal(t, second, http.StatusBadGateway, `{"error":"upstream answered 502"}`)
	for range 2 {
		wantReplay(t, second, x.do(post("/orders", orderJSON, "k1")))
	}
	wantCalls(t, &n, 2)
}

// wantIndeterminateReplays checks that the first answer, a 5xx, is
// replayed to two retries without running the handler again.
func wantIndeterminateReplays(t *testing.T, x *harness, n *atomic.Int32, status int) {
	t.Helper()
	first := x.do(post("/orders", orderJSON, "k1"))
	wantOriginal(t, first, status, fmt.Sprintf(`{"error":"upstream answered %d"}`, status))
	for range 2 {
		wantReplay(t, first, x.do(post("/orders", orderJSON, "k1")))
	}
	wantProblem(t, x.do(post("/orders", `{"amount":1}`, "k1")), http.StatusUnprocessableEntity, "key-reused")
	wantCalls(t, n, 1)
}

func testEffect5xxIndeterminate(t *testing.T, x *harness) {
	var n atomic.Int32
	x.start(nil, Route{Method: "POST", Pattern: "/orders", Handler: firstThen(&n, failWith(http.StatusBadGateway, true))})
	wantIndeterminateReplays(t, x, &n, http.StatusBadGateway)
}

// BUG: the replayed 500 lacks Cache-Control: no-store: problemResponse
// (http.go:237) records only Content-Type of the problem document it
// renders. Same cause as testNoTakeover.
func testEffectPanicIndeterminate(t *testing.T, x *harness) {
	var n atomic.Int32
	boom := panicValue{"scenario: the PSP connection broke"}
	x.start(nil, Route{Method: "POST", Pattern: "/orders", Handler: firstThen(&n, func(w http.ResponseWriter, r *http.Request) {
		core.MarkEffect(r.Context())
		panic(boom)
	})})

	res := x.do(post("/orders", orderJSON, "k1"))
	wantOriginal(t, res, http.StatusInternalServerError, "recovered by the suite")
	wantRecovered(t, x, boom)
	wantIndeterminate(t, x, "")
	wantCalls(t, &n, 1)
}

// resolverRun is the common part of the resolver scenarios: the first
// execution charges (MarkEffect, downstream key "charge") and answers 502.
type resolverRun struct {
	n        atomic.Int32
	asked    atomic.Int32
	mu       sync.Mutex
	handler  string // downstream key the handler saw
	resolver string // downstream key the resolver derived
}

func (rr *resolverRun) route() Route {
	return Route{Method: "POST", Pattern: "/orders", Handler: firstThen(&rr.n, func(w http.ResponseWriter, r *http.Request) {
		rr.mu.Lock()
		rr.handler, _ = core.DownstreamKey(r.Context(), "charge") // "" fails the comparison with the resolver's
		rr.mu.Unlock()
		failWith(http.StatusBadGateway, true)(w, r)
	})}
}

func (rr *resolverRun) resolve(outcome core.Outcome, resp *core.Response) core.Resolver {
	return func(ctx context.Context, rec store.Record) (core.Resolution, error) {
		rr.asked.Add(1)
		rr.mu.Lock()
		rr.resolver = rec.ID.DownstreamKey("charge")
		rr.mu.Unlock()
		return core.Resolution{Outcome: outcome, Response: resp}, nil
	}
}

func (rr *resolverRun) check(t *testing.T, calls int) {
	t.Helper()
	wantCalls(t, &rr.n, calls)
	if got := rr.asked.Load(); got != 1 {
		t.Errorf("the resolver was asked %d times, want 1", got)
	}
	rr.mu.Lock()
	defer rr.mu.Unlock()
	if rr.handler == "" || rr.handler != rr.resolver {
		t.Errorf("the handler's downstream key %q differs from the resolver's %q", rr.handler, rr.resolver)
	}
}

func testResolverApplied(t *testing.T, x *harness) {
	rr := new(resolverRun)
	settled := &core.Response{
		Status:   http.StatusCreated,
		Header:   http.Header{"Content-Type": {"application/json"}, "Location": {"/orders/ch_1"}},
		Body:     []byte(`{"charge":"ch_1"}`),
		BodyKept: true,
	}
	x.start([]core.Option{core.WithResolver(rr.resolve(core.OutcomeApplied, settled))}, rr.route())

	wantOriginal(t, x.do(post("/orders", orderJSON, "k1")), http.StatusBadGateway, `{"error":"upstream answered 502"}`)
	want := result{Status: http.StatusCreated, Header: settled.Header, Body: string(settled.Body)}
	for range 2 {
		wantReplay(t, want, x.do(post("/orders", orderJSON, "k1")))
	}
	rr.check(t, 1)
}

func testResolverNotApplied(t *testing.T, x *harness) {
	rr := new(resolverRun)
	x.start([]core.Option{core.WithResolver(rr.resolve(core.OutcomeNotApplied, nil))}, rr.route())

	wantOriginal(t, x.do(post("/orders", orderJSON, "k1")), http.StatusBadGateway, `{"error":"upstream answered 502"}`)
	retry := x.do(post("/orders", orderJSON, "k1"))
	wantOriginal(t, retry, http.StatusCreated, orderBody(2, "alice", orderJSON))
	wantReplay(t, retry, x.do(post("/orders", orderJSON, "k1")))
	rr.check(t, 2)
}

func testResponseCap(t *testing.T, x *harness) {
	const limit = 100
	var n, nExact atomic.Int32
	big := strings.Repeat("0123456789abcdef", 64) // 1 KiB
	exact := strings.Repeat("e", limit)
	x.start([]core.Option{core.WithMaxResponseBody(limit)},
		Route{Method: "POST", Pattern: "/reports", Handler: func(w http.ResponseWriter, r *http.Request) {
			n.Add(1)
			w.Header().Set("Content-Type", "text/csv")
			w.WriteHeader(http.StatusCreated)
			for i := 0; i < len(big); i += 64 {
				_, _ = io.WriteString(w, big[i:i+64])
			}
		}},
		Route{Method: "POST", Pattern: "/exact", Handler: func(w http.ResponseWriter, r *http.Request) {
			nExact.Add(1)
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			w.WriteHeader(http.StatusCreated)
			_, _ = io.WriteString(w, exact[:limit/2])
			_, _ = w.Write([]byte(exact[limit/2:]))
		}},
	)

	// A body of exactly the cap is kept.
	first := x.do(post("/exact", orderJSON, "k1"))
	wantOriginal(t, first, http.StatusCreated, exact)
	wantReplay(t, first, x.do(post("/exact", orderJSON, "k1")))
	wantCalls(t, &nExact, 1)

	// A key of its own: k1 is bound to the request to /exact.
	wantOriginal(t, x.do(post("/reports", orderJSON, "k2")), http.StatusCreated, big)
	for range 2 {
		dup := x.do(post("/reports", orderJSON, "k2"))
		wantProblem(t, dup, http.StatusCreated, "response-not-kept")
		if !dup.replayed() {
			t.Errorf("the not-kept answer lacks %s: true", core.HeaderReplayed)
		}
	}
	wantCalls(t, &n, 1)
}

// streamHandler writes two parts with a Flush between them; flushErr keeps
// what the Flush returned.
func streamHandler(n *atomic.Int32, flushErr *atomic.Value) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, "part 1;")
		if err := http.NewResponseController(w).Flush(); err != nil {
			flushErr.Store(err)
		}
		_, _ = io.WriteString(w, "part 2")
	}
}

func testFlushLeased(t *testing.T, x *harness) {
	var n atomic.Int32
	var flushErr atomic.Value
	x.start(nil, Route{Method: "POST", Pattern: "/stream", Handler: streamHandler(&n, &flushErr)})

	wantOriginal(t, x.do(post("/stream", orderJSON, "k1")), http.StatusCreated, "part 1;part 2")
	if err := flushErr.Load(); err != nil {
		t.Fatalf("Flush through the adapter failed: %v", err)
	}
	dup := x.do(post("/stream", orderJSON, "k1"))
	wantProblem(t, dup, http.StatusCreated, "response-not-kept")
	if !dup.replayed() {
		t.Errorf("the not-kept answer lacks %s: true", core.HeaderReplayed)
	}
	wantCalls(t, &n, 1)
}

func testFlushAtomic(t *testing.T, x *harness) {
	var n atomic.Int32
	var flushErr atomic.Value
	x.start(nil, Route{Method: "POST", Pattern: "/stream", Handler: streamHandler(&n, &flushErr)})

	first := x.do(post("/stream", orderJSON, "k1"))
	wantOriginal(t, first, http.StatusCreated, "part 1;part 2")
	if err := flushErr.Load(); err != nil {
		t.Fatalf("Flush through the adapter failed: %v", err)
	}
	wantReplay(t, first, x.do(post("/stream", orderJSON, "k1")))
	wantCalls(t, &n, 1)
}

// BUG: the replay answers 101 Switching Protocols (with the body dropped):
// recorder.Hijack (http.go) records status 101 when the handler wrote none,
// and writeReplay sends the recorded status with the not-kept problem.
func testHijackLeased(t *testing.T, x *harness) {
	var n atomic.Int32
	var hijackErr atomic.Value
	// The client reads the hijacked answer before the handler returns and
	// the engine records the outcome: WaitInFlight (the clock stands still)
	// makes the duplicate wait for the record instead of racing it.
	wait := []core.RouteOption{core.WaitInFlight(time.Minute)}
	x.startTCP(nil, Route{Method: "POST", Pattern: "/tunnel", Options: wait, Handler: func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		conn, rw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			hijackErr.Store(err)
			http.Error(w, "hijack: "+err.Error(), http.StatusInternalServerError)
			return
		}
		defer conn.Close()
		_, _ = rw.WriteString("HTTP/1.1 201 Created\r\nContent-Type: text/plain\r\nContent-Length: 8\r\nConnection: close\r\n\r\ntunneled")
		_ = rw.Flush()
	}})

	first := x.do(post("/tunnel", orderJSON, "k1"))
	if err := hijackErr.Load(); err != nil {
		t.Fatalf("Hijack through the adapter failed: %v", err)
	}
	wantOriginal(t, first, http.StatusCreated, "tunneled")
	dup := x.do(post("/tunnel", orderJSON, "k1"))
	if dup.Err != nil {
		t.Fatalf("duplicate: %v", dup.Err)
	}
	// The status of a hijacked response is unknown to the engine; whatever
	// it records, the replay must be a final answer (not 1xx).
	if dup.Status < 200 {
		t.Fatalf("the replay of a hijacked response answers %d, not a final status; response: %v", dup.Status, dup)
	}
	wantProblem(t, dup, dup.Status, "response-not-kept")
	if !dup.replayed() {
		t.Errorf("the not-kept answer lacks %s: true", core.HeaderReplayed)
	}
	wantCalls(t, &n, 1)
}

func testRequestCap(t *testing.T, x *harness) {
	const limit = 16
	var n atomic.Int32
	x.start([]core.Option{core.WithMaxRequestBody(limit)}, Route{Method: "POST", Pattern: "/orders", Handler: orderHandler(&n)})

	over := `{"note":"` + strings.Repeat("x", 100) + `"}`
	wantProblem(t, x.do(post("/orders", over, "k1")), http.StatusRequestEntityTooLarge, "body-too-large")
	r := post("/orders", over, "k2")
	r.unknownLength = true
	wantProblem(t, x.do(r), http.StatusRequestEntityTooLarge, "body-too-large")
	wantCalls(t, &n, 0)

	fits := `{"a":"` + strings.Repeat("x", limit-8) + `"}`
	wantOriginal(t, x.do(post("/orders", fits, "k1")), http.StatusCreated, orderBody(1, "alice", fits))
}

func testUpstreamBodyLimit(t *testing.T, x *harness) {
	const limit = 16
	var n atomic.Int32
	x.start(nil, Route{Method: "POST", Pattern: "/orders", Handler: orderHandler(&n)})
	router := x.h
	x.h = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r.Body = http.MaxBytesReader(w, r.Body, limit) // the application's own, tighter limit
		router.ServeHTTP(w, r)
	})

	over := `{"note":"` + strings.Repeat("x", 100) + `"}`
	res := x.do(post("/orders", over, "k1"))
	wantProblem(t, res, http.StatusRequestEntityTooLarge, "body-too-large")
	wantNoSecrets(t, "upstream body limit", res)
	wantCalls(t, &n, 0)
}

func testProblemShape(t *testing.T, x *harness) {
	const base = "https://errors.example.com/idem/"
	var n atomic.Int32
	var written atomic.Int32
	writer := func(w http.ResponseWriter, r *http.Request, p *core.Problem) {
		written.Add(1)
		w.Header().Set("X-Error-Writer", "custom")
		core.WriteProblem(w, r, p)
	}
	x.start([]core.Option{core.WithProblemBase(base), core.WithErrorWriter(writer)},
		Route{Method: "POST", Pattern: "/orders", Handler: orderHandler(&n)})

	wantOriginal(t, x.do(post("/orders", orderJSON, "k1")), http.StatusCreated, orderBody(1, "alice", orderJSON))
	rejections := []struct {
		req    *request
		status int
		slug   string
	}{
		{post("/orders", orderJSON, ""), http.StatusBadRequest, "missing-key"},
		{post("/orders", orderJSON, `"bad`), http.StatusBadRequest, "invalid-key"},
		{post("/orders", orderJSON, "k1").as(""), http.StatusUnauthorized, "unauthenticated"},
		{post("/orders", `{"amount":1}`, "k1"), http.StatusUnprocessableEntity, "key-reused"},
	}
	for _, r := range rejections {
		res := x.do(r.req)
		wantProblemBase(t, res, r.status, base, r.slug)
		if res.Header.Get("X-Error-Writer") != "custom" {
			t.Errorf("the %d %s was not written by the configured error writer", r.status, r.slug)
		}
	}
	if got := int(written.Load()); got != len(rejections) {
		t.Errorf("the error writer was called %d times, want %d", got, len(rejections))
	}
	wantCalls(t, &n, 1)
}

func testMethodsDefault(t *testing.T, x *harness) {
	methods := []string{http.MethodGet, http.MethodPut, http.MethodDelete}
	calls := map[string]*atomic.Int32{}
	var routes []Route
	for _, m := range methods {
		n := new(atomic.Int32)
		calls[m] = n
		routes = append(routes, Route{Method: m, Pattern: "/orders/{id}", Handler: func(w http.ResponseWriter, r *http.Request) {
			i := n.Add(1)
			if _, ok := core.AttemptFrom(r.Context()); ok {
				http.Error(w, "an uncovered method runs in a protected attempt", http.StatusTeapot)
				return
			}
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			fmt.Fprintf(w, "%s %d", r.Method, i)
		}})
	}
	x.start(nil, routes...)

	for _, m := range methods {
		body := ""
		if m == http.MethodPut {
			body = orderJSON
		}
		for i, key := range []string{"k1", "k1", "", `"malformed`} {
			res := x.do(newRequest(m, "/orders/7", body, key))
			wantOriginal(t, res, http.StatusOK, fmt.Sprintf("%s %d", m, i+1))
		}
		wantCalls(t, calls[m], 4)
	}
}

func testMethodsPut(t *testing.T, x *harness) {
	var n atomic.Int32
	x.start(nil, Route{Method: "PUT", Pattern: "/orders/{id}", Options: []core.RouteOption{core.Methods("PUT")}, Handler: orderHandler(&n)})

	put := func(key string) *request { return newRequest(http.MethodPut, "/orders/7", orderJSON, key) }
	wantProblem(t, x.do(put("")), http.StatusBadRequest, "missing-key")
	first := x.do(put("k1"))
	wantOriginal(t, first, http.StatusCreated, orderBody(1, "alice", orderJSON))
	wantReplay(t, first, x.do(put("k1")))
	wantCalls(t, &n, 1)
}

// BUG: the 503 has no Retry-After: acquire (engine.go:205, 217) and the
// other store-error paths return storeErr(err), not a *RetryError, so
// problemFor sets no RetryAfter. Same cause as testFailOpenAtomic.
func testStoreDown(t *testing.T, x *harness) {
	var n atomic.Int32
	x.start(nil, Route{Method: "POST", Pattern: "/orders", Handler: orderHandler(&n)})

	x.hooks.down.Store(true)
	for range 2 {
		res := x.do(post("/orders", orderJSON, "k1"))
		wantProblem(t, res, http.StatusServiceUnavailable, "store-unavailable")
		wantRetryAfter(t, res)
	}
	wantCalls(t, &n, 0)

	x.hooks.down.Store(false)
	first := x.do(post("/orders", orderJSON, "k1"))
	wantOriginal(t, first, http.StatusCreated, orderBody(1, "alice", orderJSON))
	wantReplay(t, first, x.do(post("/orders", orderJSON, "k1")))
}

func testFailOpen(t *testing.T, x *harness) {
	var n atomic.Int32
	x.start([]core.Option{core.WithFailOpen()}, Route{Method: "POST", Pattern: "/orders", Handler: orderHandler(&n)})

	x.hooks.down.Store(true)
	wantOriginal(t, x.do(post("/orders", orderJSON, "k1")), http.StatusCreated, orderBody(1, "alice", orderJSON))
	wantOriginal(t, x.do(post("/orders", orderJSON, "k1")), http.StatusCreated, orderBody(2, "alice", orderJSON))
	wantCalls(t, &n, 2)
}

// BUG: the 503 has no Retry-After (see testStoreDown).
func testFailOpenAtomic(t *testing.T, x *harness) {
	var n atomic.Int32
	x.start([]core.Option{core.WithFailOpen()}, Route{Method: "POST", Pattern: "/orders", Handler: orderHandler(&n)})

	x.hooks.down.Store(true)
	res := x.do(post("/orders", orderJSON, "k1"))
	wantProblem(t, res, http.StatusServiceUnavailable, "store-unavailable")
	wantRetryAfter(t, res)
	wantCalls(t, &n, 0)
}

func testAtomicCrash(t *testing.T, x *harness) {
	var n atomic.Int32
	g := x.gate()
	// The retry waits (the clock stands still) for the first attempt,
	// whose client went away: the attempt goes on, its claim holds, and
	// the retry gets its answer. (A crash of the process is the database's
	// to roll back: see the SIGKILL tests of reliability and examples/e2e.)
	x.start(nil, heldOrders(&n, g, core.WaitInFlight(time.Minute)))

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r := post("/orders", orderJSON, "k1")
	r.ctx = ctx
	firstCh := x.goDo(r)
	x.waitEntered(g, "first attempt")
	cancel() // the client is gone; the attempt is not

	retryCh := x.goDo(post("/orders", orderJSON, "k1"))
	g.open()
	x.await(firstCh, "first attempt")
	retry := x.await(retryCh, "retry")
	if retry.Status != http.StatusCreated || retry.Header.Get(core.HeaderReplayed) != "true" {
		t.Errorf("retry: %v, want the first attempt's 201 replayed", retry)
	}
	wantCalls(t, &n, 1)
}

func testLeasedClientGone(t *testing.T, x *harness) {
	var n atomic.Int32
	g := x.gate()
	x.start(nil, heldOrders(&n, g))

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r := post("/orders", orderJSON, "k1")
	r.ctx = ctx
	firstCh := x.goDo(r)
	x.waitEntered(g, "first attempt")
	cancel() // the client hangs up; the handler carries on (its effect happens)
	g.open()
	first := x.await(firstCh, "first attempt")
	wantOriginal(t, first, http.StatusCreated, orderBody(1, "alice", orderJSON))

	wantReplay(t, first, x.do(post("/orders", orderJSON, "k1")))
	wantCalls(t, &n, 1)
}

// lease is the lease of the lease scenarios: long enough that no heartbeat
// (every third of it, in wall-clock time) fires during a scenario.
const lease = time.Hour

func testTakeover(t *testing.T, x *harness) {
	var n atomic.Int32
	g := x.gate()
	var mu sync.Mutex
	attempts := map[int]core.AttemptInfo{}
	downstream := map[int]string{}
	x.start([]core.Option{core.WithLease(lease)}, Route{Method: "POST", Pattern: "/orders", Handler: func(w http.ResponseWriter, r *http.Request) {
		i := int(n.Add(1))
		info, _ := core.AttemptFrom(r.Context())
		mu.Lock()
		attempts[i] = info
		downstream[i], _ = core.DownstreamKey(r.Context(), "charge")
		mu.Unlock()
		if i == 1 {
			g.hold() // the process hangs: its lease lapses
		}
		writeOrder(w, r, i)
	}})

	firstCh := x.goDo(post("/orders", orderJSON, "k1"))
	x.waitEntered(g, "first attempt")
	x.clock.Advance(lease + time.Second)

	second := x.do(post("/orders", orderJSON, "k1"))
	wantOriginal(t, second, http.StatusCreated, orderBody(2, "alice", orderJSON))

	g.open()
	first := x.await(firstCh, "first attempt")
	wantProblem(t, first, http.StatusConflict, "lease-lost")
	wantRetryAfter(t, first)

	wantReplay(t, second, x.do(post("/orders", orderJSON, "k1")))
	wantCalls(t, &n, 2)

	mu.Lock()
	defer mu.Unlock()
	if attempts[1].Attempt != 1 || attempts[2].Attempt != 2 {
		t.Errorf("attempt numbers %d and %d, want 1 and 2", attempts[1].Attempt, attempts[2].Attempt)
	}
	if downstream[1] == "" || downstream[1] != downstream[2] {
		t.Errorf("downstream keys %q and %q: want one key, stable across the takeover", downstream[1], downstream[2])
	}
}

// BUG: a takeover ignores the fingerprint, so a different request runs
// under the first one's key. The store contract (store.go, Claim: "taken
// over atomically; ... Fingerprint ... set from req") and memstore's Claim
// take a lapsed lease over whatever the fingerprints, and the engine
// (engine.go acquire) compares fingerprints only when the claim fails.
func testTakeoverMismatch(t *testing.T, x *harness) {
	var n atomic.Int32
	g := x.gate()
	x.start([]core.Option{core.WithLease(lease)}, heldOrders(&n, g))

	firstCh := x.goDo(post("/orders", orderJSON, "k1"))
	x.waitEntered(g, "first attempt")
	x.clock.Advance(lease + time.Second)

	res := x.do(post("/orders", `{"amount":999999,"currency":"EUR"}`, "k1"))
	wantProblem(t, res, http.StatusUnprocessableEntity, "key-reused")
	wantCalls(t, &n, 1)

	g.open()
	first := x.await(firstCh, "first attempt")
	wantOriginal(t, first, http.StatusCreated, orderBody(1, "alice", orderJSON))
	wantReplay(t, first, x.do(post("/orders", orderJSON, "k1")))
}

// BUG: the replayed 500 outcome-unknown lacks Cache-Control: no-store:
// problemResponse (http.go:237) records only Content-Type.
func testNoTakeover(t *testing.T, x *harness) {
	var n atomic.Int32
	g := x.gate() // never opened during the scenario: the first attempt died
	x.start([]core.Option{core.WithLease(lease), core.WithoutTakeover()}, heldOrders(&n, g))

	x.goDo(post("/orders", orderJSON, "k1"))
	x.waitEntered(g, "first attempt")
	x.clock.Advance(lease + time.Second)

	wantIndeterminate(t, x, "outcome-unknown")
	wantCalls(t, &n, 1)
}

func testRetention(t *testing.T, x *harness) {
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

// BUG: fails on the replayed ETag only (see testReplay): the default
// allowlist's "ETag" is not canonical, so it is never recorded.
func testSealing(t *testing.T, x *harness) {
	const kid = "key-2030"
	sealer, err := seal.NewAESGCM(map[string][]byte{kid: bytes.Repeat([]byte{0x5a}, 32)}, kid)
	if err != nil {
		t.Fatal(err)
	}
	var n atomic.Int32
	var id atomic.Value
	const secret = "4000-0566-5566-5556"
	x.start([]core.Option{core.WithSealer(sealer)}, Route{Method: "POST", Pattern: "/cards", Handler: func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		if info, ok := core.AttemptFrom(r.Context()); ok {
			id.Store(info.ID)
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("ETag", `"card-1"`)
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"card":%q,"holder":"Ada Lovelace"}`, secret)
	}})

	first := x.do(post("/cards", orderJSON, "k1"))
	wantOriginal(t, first, http.StatusCreated, fmt.Sprintf(`{"card":%q,"holder":"Ada Lovelace"}`, secret))
	wantReplay(t, first, x.do(post("/cards", orderJSON, "k1")))
	wantCalls(t, &n, 1)

	rid, ok := id.Load().(store.ID)
	if !ok {
		t.Fatal("the handler found no attempt in its context")
	}
	rec, err := x.records.Get(context.Background(), rid, x.clock.Now())
	if err != nil {
		t.Fatalf("reading the record: %v", err)
	}
	for _, plain := range []string{secret, "Ada Lovelace", "application/json"} {
		if bytes.Contains(rec.Response, []byte(plain)) {
			t.Errorf("the stored response holds %q in plaintext", plain)
		}
	}
	if !bytes.Contains(rec.Response, []byte(kid)) {
		t.Errorf("the stored response does not name its key id %q", kid)
	}
}

func testExplicitScope(t *testing.T, x *harness) {
	var na, nb atomic.Int32
	scope := []core.RouteOption{core.Scope("create-order")}
	x.start(nil,
		Route{Method: "POST", Pattern: "/orders", Options: scope, Handler: orderHandler(&na)},
		Route{Method: "POST", Pattern: "/v2/orders", Options: scope, Handler: orderHandler(&nb)},
	)

	first := x.do(post("/orders", orderJSON, "k1"))
	wantOriginal(t, first, http.StatusCreated, orderBody(1, "alice", orderJSON))
	// The record is shared (a record of its own would run the second
	// handler), and the path is part of the request: 422.
	wantMismatch(t, x.do(post("/v2/orders", orderJSON, "k1")), "the same key and body on the other route")
	wantMismatch(t, x.do(post("/v2/orders", `{"amount":1}`, "k1")), "another body on the other route")
	wantReplay(t, first, x.do(post("/orders", orderJSON, "k1")))
	wantCalls(t, &na, 1)
	wantCalls(t, &nb, 0)
	for _, ev := range x.observed() {
		if ev.Scope != "create-order" {
			t.Errorf("a %s decision reports the scope %q, want the route's create-order", ev.Decision, ev.Scope)
		}
	}
}

func testHandlerContext(t *testing.T, x *harness) {
	var n atomic.Int32
	var mu sync.Mutex
	var info core.AttemptInfo
	var found, inTx bool
	var downstream string
	x.start(nil, Route{Method: "POST", Pattern: "/orders", Handler: func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		info, found = core.AttemptFrom(r.Context())
		downstream, _ = core.DownstreamKey(r.Context(), "charge")
		if ts, ok := x.store.(store.TxStore); ok {
			inTx = ts.InTx(r.Context())
		}
		mu.Unlock()
		writeOrder(w, r, int(n.Add(1)))
	}})

	wantOriginal(t, x.do(post("/orders", orderJSON, "k1")), http.StatusCreated, orderBody(1, "alice", orderJSON))
	mu.Lock()
	defer mu.Unlock()
	if !found {
		t.Fatal("core.AttemptFrom found no attempt in the handler's request context")
	}
	want := store.Identity{Caller: "alice", Scope: "", Key: "k1"} // no Scope option: the empty scope
	if info.Identity != want || info.ID != want.ID() {
		t.Errorf("identity %+v (ID %v), want %+v (ID %v)", info.Identity, info.ID, want, want.ID())
	}
	if info.Attempt != 1 {
		t.Errorf("attempt %d, want 1", info.Attempt)
	}
	if info.Atomic != (x.mode == atomicMode) {
		t.Errorf("AttemptInfo.Atomic = %v in %v mode", info.Atomic, x.mode)
	}
	if downstream == "" {
		t.Error("core.DownstreamKey is empty in a protected request")
	}
	if x.mode == atomicMode && !inTx {
		t.Error("the handler's request context does not carry the store's transaction")
	}
}

func testAtomicInAppTransaction(t *testing.T, x *harness) {
	var n atomic.Int32
	x.start(nil, Route{Method: "POST", Pattern: "/orders", Handler: orderHandler(&n)})

	// A transaction-per-request middleware's transaction of the store,
	// in the request's context (as sqlstore.WithTx puts it there).
	txs, ok := x.store.(store.TxStore)
	if !ok {
		t.Fatal("atomic mode without a TxStore")
	}
	ctx, tx, err := txs.Begin(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback() }()
	r := post("/orders", orderJSON, "k1")
	r.ctx = ctx
	res := x.do(r)
	wantProblem(t, res, http.StatusInternalServerError, "not-protected")
	wantCalls(t, &n, 0)
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	// Without the application's transaction the route protects as usual.
	res = x.do(post("/orders", orderJSON, "k1"))
	if res.Status != http.StatusCreated {
		t.Fatalf("without the application's transaction: %d, want 201", res.Status)
	}
	wantCalls(t, &n, 1)
}
