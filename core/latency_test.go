package core_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/memstore"
	"github.com/idemkit/idem/core/observe"
)

// TestEventLatencies: every decision that reached the store reports how
// long its claim took, and every execution how long recording its outcome
// took, measured on the engine's clock (a clock that advances a fixed step
// per reading makes both exact and non-zero).
func TestEventLatencies(t *testing.T) {
	var mu sync.Mutex
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	clock := func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		now = now.Add(time.Millisecond)
		return now
	}
	var events []observe.Event
	e, err := core.New(memstore.New(), core.WithSingleCaller(), core.WithClock(clock), core.WithObserver(func(_ context.Context, ev observe.Event) {
		events = append(events, ev)
	}))
	if err != nil {
		t.Fatal(err)
	}
	h := e.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(201) }), core.Scope("orders"))
	for range 2 {
		r := httptest.NewRequest("POST", "/orders", strings.NewReader(`{}`))
		r.Header.Set(core.HeaderKey, "k")
		h.ServeHTTP(httptest.NewRecorder(), r)
	}
	if _, err := e.Once(context.Background(), core.Message{Consumer: "mailer", ID: "m1"}, func(context.Context) ([]byte, error) { return nil, nil }); err != nil {
		t.Fatal(err)
	}
	if len(events) != 3 {
		t.Fatalf("%d events, want 3", len(events))
	}
	for i, want := range []struct {
		decision observe.Decision
		complete bool
	}{{observe.DecisionExecuted, true}, {observe.DecisionReplayed, false}, {observe.DecisionExecuted, true}} {
		ev := events[i]
		if ev.Decision != want.decision || ev.Claim <= 0 || (ev.Complete > 0) != want.complete || ev.Claim+ev.Complete > ev.Duration {
			t.Errorf("event %d: %s claim %v complete %v duration %v; want %s with a claim and complete %v within the duration", i, ev.Decision, ev.Claim, ev.Complete, ev.Duration, want.decision, want.complete)
		}
	}
}
