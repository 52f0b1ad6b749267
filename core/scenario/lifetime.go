package scenario

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/store"
)

// Scenarios of an attempt's lifetime: a client that goes away during a
// leased attempt, and an atomic answer larger than the recording cap.

// testLeasedClientGoneAfterEffect: the client hangs up after the handler
// marked its effect (the provider is being charged). The handler's context
// stays alive, the attempt runs to its end and records its 201, and the
// client's retry gets that 201 replayed: the provider is charged once.
func testLeasedClientGoneAfterEffect(t *testing.T, x *harness) {
	var n atomic.Int32
	g := x.gate()
	var mu sync.Mutex
	var seen error // the handler's context error after the client left
	x.start(nil, Route{Method: "POST", Pattern: "/payments", Handler: func(w http.ResponseWriter, r *http.Request) {
		i := n.Add(1)
		core.MarkEffect(r.Context())
		if i == 1 {
			g.hold() // the provider call is under way; the client hangs up
			mu.Lock()
			seen = r.Context().Err()
			mu.Unlock()
			if err := r.Context().Err(); err != nil {
				// What a handler does with a cancelled context: give up.
				http.Error(w, "cancelled: "+err.Error(), http.StatusServiceUnavailable)
				return
			}
		}
		writeOrder(w, r, int(i))
	}})

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r := post("/payments", orderJSON, "k1")
	r.ctx = ctx
	firstCh := x.goDo(r)
	x.waitEntered(g, "first attempt")
	cancel() // the client times out and goes away
	g.open()
	first := x.await(firstCh, "first attempt")
	mu.Lock()
	if seen != nil {
		t.Errorf("the leased handler's context ended when the client went away (%v); it must run to its end", seen)
	}
	mu.Unlock()
	wantOriginal(t, first, http.StatusCreated, orderBody(1, "alice", orderJSON))

	retry := x.do(post("/payments", orderJSON, "k1"))
	wantReplay(t, first, retry)
	wantCalls(t, &n, 1)
}

// bigChunk is what the streaming handler writes, again and again.
var bigChunk = []byte(strings.Repeat("0123456789abcdef", 4096)) // 64 KiB

// streamBytes is the size of the streamed answer: 50 MiB.
const streamBytes = 50 << 20

// testAtomicStreamPastCap: in atomic mode a 50 MiB answer, far over the
// recording cap, is not held in memory: past the cap the rest spills to a
// temporary file; when the handler returns the engine records the status
// (body not kept) and commits, then sends the held bytes and the file. The
// client sees the headers only after the commit, gets every byte, and a
// retry gets the status with a response-not-kept problem document.
func testAtomicStreamPastCap(t *testing.T, x *harness) {
	var n atomic.Int32
	var writeErr atomic.Value
	x.startTCP(nil, Route{Method: "POST", Pattern: "/exports", Handler: func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		w.Header().Set("Content-Type", "text/csv")
		w.WriteHeader(http.StatusCreated)
		for sent := 0; sent < streamBytes; sent += len(bigChunk) {
			if _, err := w.Write(bigChunk); err != nil {
				writeErr.Store(err)
				return
			}
		}
	}})

	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)

	req, err := http.NewRequest(http.MethodPost, x.srv.URL+"/exports", strings.NewReader(orderJSON))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Caller", "alice")
	req.Header.Set(core.HeaderKey, "k1")
	res, err := x.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	// The headers arrived: the record must already be committed.
	id := store.Identity{Caller: "alice", Key: "k1"}.ID()
	rec, err := x.records.Get(context.Background(), id, x.clock.Now())
	if err != nil || rec.State != store.StateCompleted || rec.Status != http.StatusCreated {
		t.Errorf("when the client got the headers the record was %+v (%v), want committed as completed 201", rec, err)
	}
	got, err := io.Copy(io.Discard, res.Body)
	if err != nil {
		t.Fatalf("reading the streamed answer: %v (after %d bytes)", err, got)
	}
	runtime.ReadMemStats(&after)
	if res.StatusCode != http.StatusCreated || got != streamBytes {
		t.Fatalf("the client got %d with %d bytes, want 201 with %d", res.StatusCode, got, streamBytes)
	}
	if err := writeErr.Load(); err != nil {
		t.Fatalf("a write of the handler failed: %v", err)
	}
	// Allocations of the whole exchange (server and client in this
	// process): holding the answer would allocate at least its 50 MiB.
	const bound = 16 << 20
	if d := after.TotalAlloc - before.TotalAlloc; d > bound {
		t.Errorf("the exchange allocated %d MiB for a %d MiB answer, want under %d MiB: the answer was held in memory",
			d>>20, streamBytes>>20, bound>>20)
	}
	if after.HeapInuse > before.HeapInuse+bound {
		t.Errorf("heap in use grew from %d MiB to %d MiB during a %d MiB answer", before.HeapInuse>>20, after.HeapInuse>>20, streamBytes>>20)
	}

	dup := x.do(post("/exports", orderJSON, "k1"))
	wantProblem(t, dup, http.StatusCreated, "response-not-kept")
	if !dup.replayed() {
		t.Errorf("the not-kept answer lacks %s: true", core.HeaderReplayed)
	}
	wantCalls(t, &n, 1)
}

// testAtomicCapCommitFails: in atomic mode, when the commit of an answer
// past the cap fails, the handler's writes (spilled to a temporary file)
// succeeded, but nothing of its body reaches the client, which gets the 503
// store-unavailable problem; nothing was recorded, so the retry runs.
func testAtomicCapCommitFails(t *testing.T, x *harness) {
	const limit = 100
	var n atomic.Int32
	var writeErr atomic.Value
	big := strings.Repeat("x", 64)
	x.start([]core.Option{core.WithMaxResponseBody(limit)}, Route{Method: "POST", Pattern: "/reports", Handler: func(w http.ResponseWriter, r *http.Request) {
		i := n.Add(1)
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.WriteHeader(http.StatusCreated)
		if i == 1 {
			x.hooks.down.Store(true) // the database fails before the commit
		}
		for range 4 {
			if _, err := io.WriteString(w, big); err != nil {
				writeErr.Store(err)
				return
			}
		}
	}})

	res := x.do(post("/reports", orderJSON, "k1"))
	wantProblem(t, res, http.StatusServiceUnavailable, "store-unavailable")
	if strings.Contains(res.Body, big) {
		t.Errorf("the client got part of the handler's body with the 503: %q", res.Body)
	}
	if err, _ := writeErr.Load().(error); err != nil {
		t.Errorf("the handler's write past the cap failed: %v, want nil (spilled until the commit)", err)
	}

	x.hooks.down.Store(false)
	retry := x.do(post("/reports", orderJSON, "k1"))
	wantOriginal(t, retry, http.StatusCreated, strings.Repeat(big, 4))
	wantCalls(t, &n, 2)
}

// testAtomicClientGone: in atomic mode an attempt outlives its client: a
// client that goes away while the handler runs does not end the handler's
// context nor roll its transaction back; the handler's 201 is recorded and
// the retry replays it. The handler runs once.
func testAtomicClientGone(t *testing.T, x *harness) {
	var n atomic.Int32
	g := x.gate()
	x.start(nil, Route{Method: "POST", Pattern: "/orders", Handler: func(w http.ResponseWriter, r *http.Request) {
		i := n.Add(1)
		if i == 1 {
			g.hold()
			if err := r.Context().Err(); err != nil {
				http.Error(w, fmt.Sprintf("cancelled: %v", err), http.StatusServiceUnavailable)
				return
			}
		}
		writeOrder(w, r, int(i))
	}})

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r := post("/orders", orderJSON, "k1")
	r.ctx = ctx
	firstCh := x.goDo(r)
	x.waitEntered(g, "first attempt")
	cancel()
	g.open()
	x.await(firstCh, "first attempt")

	retry := x.do(post("/orders", orderJSON, "k1"))
	wantReplay(t, retry, x.do(post("/orders", orderJSON, "k1")))
	if retry.Status != http.StatusCreated || retry.Header.Get(core.HeaderReplayed) != "true" {
		t.Errorf("retry after the client went away: %v, want the first attempt's 201 replayed", retry)
	}
	wantCalls(t, &n, 1)
}

// testLateBodyReader: http.TimeoutHandler inside the protected route. Its
// handler goroutine outlives the request: when the timeout fires the
// client gets the 503 and the engine's Serve returns, while the handler
// goes on reading the request body on its own goroutine. Meanwhile other
// requests run through the engine. The late reader must read its own
// request's body, whole, and never bytes of another request (a body
// buffer handed back to a pool when Serve returns would be reused by the
// other requests under the late reader).
func testLateBodyReader(t *testing.T, x *harness) {
	const churners, perChurner = 4, 25
	lateBody := `{"note":"` + strings.Repeat("L", 2000) + `"}`
	churnBody := `{"note":"` + strings.Repeat("C", 2000) + `"}`
	goRead := make(chan struct{})
	late := make(chan string, 1)
	inner := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		<-r.Context().Done() // the timeout fired: the 503 is on its way
		var b strings.Builder
		p := make([]byte, 7)
		n, _ := r.Body.Read(p) // while the engine's Serve returns
		b.Write(p[:n])
		<-goRead // the client has its answer: Serve has returned
		for {
			n, err := r.Body.Read(p) // slowly, while the other requests run
			b.Write(p[:n])
			runtime.Gosched()
			if err != nil {
				break
			}
		}
		late <- b.String()
	})
	var n atomic.Int32
	x.start(nil,
		Route{Method: "POST", Pattern: "/slow", Handler: http.TimeoutHandler(inner, time.Millisecond, "timed out").ServeHTTP},
		Route{Method: "POST", Pattern: "/orders", Handler: orderHandler(&n)},
	)

	res := x.do(post("/slow", lateBody, "late"))
	wantStatus(t, res, http.StatusServiceUnavailable)

	var wg sync.WaitGroup
	for c := range churners {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range perChurner {
				res := x.do(post("/orders", churnBody, fmt.Sprintf("churn-%d-%d", c, i)))
				if res.Status != http.StatusCreated {
					t.Errorf("churning request: %v", res)
					return
				}
			}
		}()
	}
	close(goRead)
	var got string
	select {
	case got = <-late:
	case <-time.After(failsafe):
		t.Fatal("the late reader did not finish")
	}
	wg.Wait()
	if strings.Contains(got, "C") {
		t.Fatalf("the late reader read another request's body bytes: %q", got)
	}
	if got != lateBody {
		t.Fatalf("the late reader read %d bytes %.60q..., want its own %d-byte body", len(got), got, len(lateBody))
	}
}

// testMaxAttempt: a handler that waits for its context (an external call
// that never answers) is ended at MaxAttempt with cause ErrAttemptTimeout,
// although its client is still there; its 503 before MarkEffect releases
// the key, and the retry runs.
func testMaxAttempt(t *testing.T, x *harness) {
	var n atomic.Int32
	causes := make(chan error, 1)
	x.start(nil, Route{Method: "POST", Pattern: "/orders", Options: []core.RouteOption{core.MaxAttempt(50 * time.Millisecond)}, Handler: func(w http.ResponseWriter, r *http.Request) {
		i := n.Add(1)
		if i == 1 {
			select {
			case <-r.Context().Done():
				causes <- context.Cause(r.Context())
			case <-time.After(failsafe):
				causes <- nil
			}
			http.Error(w, "the provider did not answer", http.StatusServiceUnavailable)
			return
		}
		writeOrder(w, r, int(i))
	}})

	first := x.do(post("/orders", orderJSON, "k1"))
	if first.Status != http.StatusServiceUnavailable {
		t.Errorf("first: %v, want the handler's 503", first)
	}
	if cause := <-causes; !errors.Is(cause, core.ErrAttemptTimeout) {
		t.Errorf("the handler's context ended with %v, want ErrAttemptTimeout", cause)
	}
	retry := x.do(post("/orders", orderJSON, "k1"))
	wantOriginal(t, retry, http.StatusCreated, orderBody(2, "alice", orderJSON))
	wantCalls(t, &n, 2)
}
