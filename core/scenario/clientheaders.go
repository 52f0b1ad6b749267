package scenario

import (
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/idemkit/idem/core"
)

// Scenarios of what a client sees besides status and body: the request
// header that carries the key, and the Link of a problem document.

func testProblemDocs(t *testing.T, x *harness) {
	const docs = "https://api.example.com/docs/idempotency"
	var n atomic.Int32
	x.start([]core.Option{core.WithProblemDocs(docs)}, Route{Method: "POST", Pattern: "/orders", Handler: orderHandler(&n)})

	want := "<" + docs + `>; rel="describedby"`
	for _, r := range []*request{post("/orders", orderJSON, ""), post("/orders", orderJSON, "k1"), post("/orders", `{"other":1}`, "k1")} {
		res := x.do(r)
		if res.Status < 400 {
			continue // the first k1 runs
		}
		if got := res.Header.Get("Link"); got != want {
			t.Errorf("%d %s: Link %q, want %q", res.Status, res.Body, got, want)
		}
	}

	if n.Load() != 1 {
		t.Errorf("the handler ran %d times, want 1", n.Load())
	}
}

func testKeyHeaderOption(t *testing.T, x *harness) {
	const name = "X-Idempotency-Key"
	var n atomic.Int32
	x.start([]core.Option{core.WithKeyHeader("x-idempotency-key")}, Route{Method: "POST", Pattern: "/orders", Handler: orderHandler(&n)})

	first := x.do(post("/orders", orderJSON, "").set(name, "k1"))
	wantOriginal(t, first, http.StatusCreated, orderBody(1, "alice", orderJSON))
	wantReplay(t, first, x.do(post("/orders", orderJSON, "").set(name, "k1")))

	missing := wantProblem(t, x.do(post("/orders", orderJSON, "k2")), http.StatusBadRequest, "missing-key")
	if !strings.Contains(missing.Title+missing.Detail, name) {
		t.Errorf("the missing-key problem does not name %s: %+v", name, missing)
	}
	wantProblem(t, x.do(post("/orders", orderJSON, "").set(name, "k1", "k1")), http.StatusBadRequest, "invalid-key")
	wantCalls(t, &n, 1)
}
