package core_test

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/memstore"
	"github.com/idemkit/idem/core/store"
)

func compositionEngine(t *testing.T, store store.Store) *core.Engine {
	t.Helper()
	e, err := core.New(store, core.WithSingleCaller(), core.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func send(h http.Handler, path, key string) *httptest.ResponseRecorder {
	req := httptest.NewRequest("POST", path, strings.NewReader(`{"amount":1}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(core.HeaderKey, key)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, req)
	return w
}

// hidingWriter wraps a writer without Unwrap, as some older middleware
// does.
type hidingWriter struct{ w http.ResponseWriter }

func (h hidingWriter) Header() http.Header         { return h.w.Header() }
func (h hidingWriter) Write(b []byte) (int, error) { return h.w.Write(b) }
func (h hidingWriter) WriteHeader(code int)        { h.w.WriteHeader(code) }

// TestNestedBehindHidingWriter: two layers with a writer wrapper between
// them that has no Unwrap still run as one (the inner layer meets the
// outer's claim of the same identity and takes over): no 409, the handler
// runs once, the inner Retention applies.
func TestNestedBehindHidingWriter(t *testing.T) {
	for _, mode := range []string{"leased", "atomic"} {
		t.Run(mode, func(t *testing.T) {
			var store store.Store = memstore.New()
			if mode == "atomic" {
				store = store.(*memstore.Store).Atomic()
			}
			e := compositionEngine(t, store)
			runs := 0
			inner := e.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				runs++
				w.WriteHeader(http.StatusCreated)
				_, _ = io.WriteString(w, "created")
			}), core.Retention(time.Hour))
			hide := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { inner.ServeHTTP(hidingWriter{w}, r) })
			mux := http.NewServeMux()
			mux.Handle("POST /orders", e.Handler(hide))

			first := send(mux, "/orders", "k1")
			if first.Code != http.StatusCreated || first.Body.String() != "created" {
				t.Fatalf("first: %d %q, want the handler's 201", first.Code, first.Body)
			}
			again := send(mux, "/orders", "k1")
			if again.Code != http.StatusCreated || again.Header().Get(core.HeaderReplayed) != "true" {
				t.Errorf("retry: %d %q, want the replayed 201", again.Code, again.Body)
			}
			if runs != 1 {
				t.Errorf("the handler ran %d times, want 1", runs)
			}
		})
	}
}

// TestSubRequestKeepsTheOuterProtection: a protected handler that serves
// an in-process sub-request to another protected handler, with its own
// context and a writer of its own, stays protected itself: the
// sub-request is protected on its own and never takes the outer request
// over.
func TestSubRequestKeepsTheOuterProtection(t *testing.T) {
	e := compositionEngine(t, memstore.New())
	var audits, orders int
	audit := e.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		audits++
		w.WriteHeader(http.StatusCreated)
	}), core.Scope("audit"))
	mux := http.NewServeMux()
	mux.Handle("POST /orders", e.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		orders++
		sub, _ := http.NewRequestWithContext(r.Context(), "POST", "/audit", strings.NewReader(`{}`))
		sub.Header.Set(core.HeaderKey, r.Header.Get(core.HeaderKey))
		rec := httptest.NewRecorder()
		audit.ServeHTTP(rec, sub)
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, "order, audit "+http.StatusText(rec.Code))
	})))

	first := send(mux, "/orders", "k1")
	if first.Code != http.StatusCreated || first.Body.String() != "order, audit Created" {
		t.Fatalf("first: %d %q", first.Code, first.Body)
	}
	again := send(mux, "/orders", "k1")
	if again.Header().Get(core.HeaderReplayed) != "true" || again.Body.String() != first.Body.String() {
		t.Errorf("retry: %d %q, want the replay of the first answer (the outer request must stay protected)", again.Code, again.Body)
	}
	if orders != 1 || audits != 1 {
		t.Errorf("orders ran %d times and audits %d, want 1 and 1", orders, audits)
	}
}

// TestSubRequestWithTheClientsKey: an in-process sub-request to another
// protected route (no Scope option) that forwards the client's key has the
// outer request's identity (the scope is empty by default) but another
// fingerprint: it is not taken for the outer request nested behind a
// writer (which would leave the outer unprotected, its answer unrecorded),
// it is a key reused for a different request (422: the mismatch comes
// before the in-progress state), and the outer request stays protected.
func TestSubRequestWithTheClientsKey(t *testing.T) {
	for _, mode := range []string{"leased", "atomic"} {
		t.Run(mode, func(t *testing.T) {
			var store store.Store = memstore.New()
			if mode == "atomic" {
				store = store.(*memstore.Store).Atomic()
			}
			e := compositionEngine(t, store)
			var audits, orders int
			audit := e.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				audits++
				w.WriteHeader(http.StatusCreated)
			}))
			mux := http.NewServeMux()
			mux.Handle("POST /orders", e.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				orders++
				sub, _ := http.NewRequestWithContext(r.Context(), "POST", "/audit", strings.NewReader(`{}`))
				sub.Header.Set(core.HeaderKey, r.Header.Get(core.HeaderKey))
				rec := httptest.NewRecorder()
				audit.ServeHTTP(rec, sub)
				w.WriteHeader(http.StatusCreated)
				_, _ = io.WriteString(w, "order, audit "+http.StatusText(rec.Code))
			})))

			first := send(mux, "/orders", "k1")
			if first.Code != http.StatusCreated || first.Body.String() != "order, audit Unprocessable Entity" {
				t.Fatalf("first: %d %q, want the order and the audit's 422", first.Code, first.Body)
			}
			again := send(mux, "/orders", "k1")
			if again.Header().Get(core.HeaderReplayed) != "true" || again.Body.String() != first.Body.String() {
				t.Errorf("retry: %d %q, want the replay of the first answer (the outer request must stay protected)", again.Code, again.Body)
			}
			if orders != 1 || audits != 0 {
				t.Errorf("orders ran %d times and audits %d, want 1 and 0", orders, audits)
			}
		})
	}
}
