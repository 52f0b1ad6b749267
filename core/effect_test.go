package core_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/memstore"
	"github.com/idemkit/idem/core/store"
)

// A handler behind http.TimeoutHandler outlives its attempt: once the
// attempt was settled (the timeout answered, the engine recorded that
// answer), MarkEffect must fail, so the handler does not start an effect
// it believes covered (issue 21, item 4).
func TestMarkEffectAfterTheAttemptSettled(t *testing.T) {
	e, err := core.New(memstore.New(), core.WithSingleCaller(), quiet)
	if err != nil {
		t.Fatal(err)
	}
	late := make(chan error, 1)
	release := make(chan struct{})
	slow := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		<-release // the timeout answers meanwhile
		late <- core.MarkEffect(r.Context())
	})
	h := e.Handler(http.TimeoutHandler(slow, 10*time.Millisecond, "timed out"), core.Leased())
	w := post(h, "late")
	if w.Code != http.StatusServiceUnavailable {
		t.Fatalf("first: %d %q, want TimeoutHandler's 503", w.Code, w.Body)
	}
	close(release)
	if err := <-late; !errors.Is(err, core.ErrNoAttempt) {
		t.Fatalf("MarkEffect after the attempt settled: %v, want an error wrapping ErrNoAttempt", err)
	}
}

// failingComplete is a store whose Complete fails while fail is set (a
// node that died between the provider call and the completion).
type failingComplete struct {
	store.Store
	fail atomic.Bool
}

func (s *failingComplete) Complete(ctx context.Context, id store.ID, token int64, c store.Completion) error {
	if s.fail.Load() {
		return core.ErrStoreUnavailable
	}
	return s.Store.Complete(ctx, id, token, c)
}

// In leased mode an answer after MarkEffect that cannot be recorded never
// reaches the client unrecorded: it gets 503 outcome-pending with
// Retry-After (which idemclient retries), and once the store is back the
// takeover of the lapsed lease settles it (issue 21, item 6). Without an
// effect, the handler's answer is delivered as before.
func TestLeasedUnrecordableAnswerAfterEffect(t *testing.T) {
	st := &failingComplete{Store: memstore.New()}
	e, err := core.New(st, core.WithSingleCaller(), core.WithLease(time.Second), quiet)
	if err != nil {
		t.Fatal(err)
	}
	var runs atomic.Int32
	h := e.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		if strings.Contains(r.Header.Get(core.HeaderKey), "effect") {
			_ = core.MarkEffect(r.Context())
		}
		w.WriteHeader(http.StatusCreated)
	}))
	st.fail.Store(true)
	w := post(h, "with-effect")
	if w.Code != http.StatusServiceUnavailable || !strings.Contains(w.Body.String(), "outcome-pending") || w.Header().Get("Retry-After") == "" {
		t.Fatalf("after MarkEffect, Complete failing: %d %q (Retry-After %q), want 503 outcome-pending with Retry-After",
			w.Code, w.Body, w.Header().Get("Retry-After"))
	}
	w = post(h, "no-mark")
	if w.Code != http.StatusCreated {
		t.Fatalf("without MarkEffect, Complete failing: %d %q, want the handler's 201", w.Code, w.Body)
	}
	if n := runs.Load(); n != 2 {
		t.Fatalf("the handler ran %d times, want 2", n)
	}
}
