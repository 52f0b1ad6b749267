package core_test

import (
	"net/http"
	"testing"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/memstore"
)

// TestOuterHeadersSurviveTheEnginesAnswer: when the engine throws the
// handler's answer away (its transaction lost a race, or its completion
// met an aborted transaction) and writes its own, the headers an outer
// middleware set before the handler ran (CORS: a browser that does not
// get them sees a CORS error instead of the problem) are kept, and the
// handler's own are dropped.
func TestOuterHeadersSurviveTheEnginesAnswer(t *testing.T) {
	for _, tc := range []struct {
		name       string
		arm        func(*losing)
		wantStatus int
	}{
		{"LostRace_409", func(l *losing) { l.lose.Store(true) }, http.StatusConflict},
		{"AbortedCompletion_503", func(l *losing) { l.failComplete(aborted) }, http.StatusServiceUnavailable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := &losing{AtomicStore: memstore.New().Atomic()}
			e, err := core.New(st, core.WithSingleCaller(), quiet)
			if err != nil {
				t.Fatal(err)
			}
			inner := e.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("X-Order", "or_1")
				w.Header().Set("Access-Control-Allow-Origin", "https://evil.example")
				w.WriteHeader(http.StatusCreated)
			}))
			cors := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Access-Control-Allow-Origin", "https://shop.example")
				w.Header().Set("Access-Control-Expose-Headers", "Idempotent-Replayed, Retry-After, Link")
				inner.ServeHTTP(w, r)
			})
			tc.arm(st)
			w := post(cors, "k")
			if w.Code != tc.wantStatus {
				t.Fatalf("status %d %q, want %d", w.Code, w.Body, tc.wantStatus)
			}
			if got := w.Header().Get("Access-Control-Allow-Origin"); got != "https://shop.example" {
				t.Errorf("Access-Control-Allow-Origin %q, want the outer middleware's", got)
			}
			if got := w.Header().Get("Access-Control-Expose-Headers"); got == "" {
				t.Errorf("Access-Control-Expose-Headers dropped: the browser cannot read Retry-After")
			}
			if got := w.Header().Get("X-Order"); got != "" {
				t.Errorf("X-Order %q: the handler's discarded answer leaked a header", got)
			}
			if got := w.Header().Get("Retry-After"); got == "" {
				t.Errorf("no Retry-After on the engine's %d", w.Code)
			}
		})
	}
}
