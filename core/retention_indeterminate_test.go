package core_test

import (
	"net/http"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/memstore"
)

// A route keeps its records for 72 h (Retention), the engine
// has the default 24 h and WithoutTakeover. An attempt marks its effect
// (charges) and its process dies. A retry after the lapse gets 500
// outcome-unknown (the record turned indeterminate). The client keeps
// retrying within the route's stated 72 h window: at 25 h the key must
// still answer outcome-unknown, never charge again (found by an
// adversarial review, 2026-12-08; failed before markIndeterminate kept
// the route's retention).
func TestIndeterminateKeepsTheRoutesRetention(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := memstore.New()
		dead, err := core.New(&flaky{Store: st}, core.WithSingleCaller(), core.WithoutTakeover(), quiet)
		if err != nil {
			t.Fatal(err)
		}
		alive, err := core.New(st, core.WithSingleCaller(), core.WithoutTakeover(), quiet)
		if err != nil {
			t.Fatal(err)
		}
		var charges atomic.Int32
		gone := make(chan struct{})
		defer close(gone)
		hd := dead.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_ = core.MarkEffect(r.Context())
			charges.Add(1)
			dead.Store().(*flaky).paused.Store(true) // the process dies after the charge
			<-gone
		}), core.Scope("pay"), core.Retention(72*time.Hour))
		ha := alive.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_ = core.MarkEffect(r.Context())
			charges.Add(1)
			w.WriteHeader(201)
		}), core.Scope("pay"), core.Retention(72*time.Hour))
		go post(hd, "k")
		synctest.Wait()
		time.Sleep(31 * time.Second) // the lease lapsed
		if w := post(ha, "k"); w.Code != 500 {
			t.Fatalf("retry at 31 s: %d %s, want 500 outcome-unknown", w.Code, w.Body)
		}
		time.Sleep(25 * time.Hour) // well within the route's 72 h
		w := post(ha, "k")
		if n := charges.Load(); n != 1 || w.Code != 500 {
			t.Fatalf("retry at 25 h (route retention 72 h): %d %s; charged %d times, want 500 outcome-unknown and one charge", w.Code, w.Body, n)
		}
	})
}
