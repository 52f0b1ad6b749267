package core_test

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/memstore"
)

// TestProblemDocsOff: WithProblemDocs("") sends problem documents without
// a Link; a recorded problem (a panic's 500, replayed) keeps the Link of
// when it was recorded.
func TestProblemDocsOff(t *testing.T) {
	e, err := core.New(memstore.New(), core.WithSingleCaller(), core.WithProblemDocs(""))
	if err != nil {
		t.Fatal(err)
	}
	w := httptest.NewRecorder()
	e.Handler(http.NotFoundHandler()).ServeHTTP(w, httptest.NewRequest("POST", "/orders", nil))
	if w.Code != http.StatusBadRequest || w.Header().Get("Link") != "" {
		t.Errorf("%d with Link %q, want 400 without a Link", w.Code, w.Header().Get("Link"))
	}
}

func TestProblemDocsRecorded(t *testing.T) {
	e, err := core.New(memstore.New(), core.WithSingleCaller())
	if err != nil {
		t.Fatal(err)
	}
	h := e.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_ = core.MarkEffect(r.Context())
		panic("boom")
	}))
	serve := func() *httptest.ResponseRecorder {
		w := httptest.NewRecorder()
		r := httptest.NewRequest("POST", "/orders", strings.NewReader("{}"))
		r.Header.Set(core.HeaderKey, "k1")
		func() {
			defer func() { _ = recover() }()
			h.ServeHTTP(w, r)
		}()
		return w
	}
	serve()
	replay := serve()
	want := "<" + core.DefaultProblemDocs + `>; rel="describedby"`
	if replay.Code != http.StatusInternalServerError || replay.Header().Get(core.HeaderReplayed) != "true" || replay.Header().Get("Link") != want {
		t.Errorf("replay of a recorded problem: %d, replayed %q, Link %q; want 500 replayed with Link %q",
			replay.Code, replay.Header().Get(core.HeaderReplayed), replay.Header().Get("Link"), want)
	}
}

func TestKeyHeaderMisuse(t *testing.T) {
	for _, name := range []string{"", " ", "Idempotency Key", "X-Key:"} {
		if _, err := core.New(memstore.New(), core.WithSingleCaller(), core.WithKeyHeader(name)); !errors.Is(err, core.ErrConfig) {
			t.Errorf("WithKeyHeader(%q): %v, want ErrConfig", name, err)
		}
	}
	e, err := core.New(memstore.New(), core.WithSingleCaller(), core.WithKeyHeader("x-request-key"))
	if err != nil || e.KeyHeader() != "X-Request-Key" {
		t.Errorf("KeyHeader() = %q (%v), want X-Request-Key", e.KeyHeader(), err)
	}
}

// TestExposedHeaders: every header the engine sets on an answer that a
// browser may not read by default is in ExposedHeaders.
func TestExposedHeaders(t *testing.T) {
	for _, h := range []string{core.HeaderReplayed, "Retry-After", "Link"} {
		if !slices.Contains(core.ExposedHeaders, h) {
			t.Errorf("ExposedHeaders %v lacks %s", core.ExposedHeaders, h)
		}
	}
}
