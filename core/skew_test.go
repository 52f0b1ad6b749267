package core_test

import (
	"context"
	"net/http"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/memstore"
	"github.com/idemkit/idem/core/syncclock"
)

type sharedClock struct{}

func (sharedClock) Now(context.Context) (time.Time, error) { return time.Now(), nil }

// Two processes share one store; the second's wall clock runs 10 s ahead.
// With the shared (database) clock they agree that the first's lease is
// live; with raw wall clocks the second would take over a live attempt and
// run the work twice.
func TestClockSkewBetweenProcesses(t *testing.T) {
	for _, synced := range []bool{true, false} {
		synctest.Test(t, func(t *testing.T) {
			store := memstore.New()
			skewedNow := func() time.Time { return time.Now().Add(10 * time.Second) }
			clockB := skewedNow
			if synced {
				c, err := syncclock.New(t.Context(), sharedClock{}, time.Second)
				if err != nil {
					t.Fatal(err)
				}
				defer c.Stop()
				clockB = c.Now // its local clock is skewed, its offset corrects it
			}
			var runs atomic.Int32
			release := make(chan struct{})
			handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if runs.Add(1) == 1 {
					<-release
				}
				w.WriteHeader(201)
			})
			mk := func(clock func() time.Time) http.Handler {
				e, err := core.New(store, core.WithSingleCaller(), core.WithLease(3*time.Second), core.WithClock(clock), quiet)
				if err != nil {
					t.Fatal(err)
				}
				return e.Handler(handler, core.Scope("pay"))
			}
			a, b := mk(time.Now), mk(clockB)
			first := make(chan int)
			go func() { first <- post(a, "k").Code }()
			time.Sleep(time.Second)
			second := post(b, "k").Code
			close(release)
			<-first
			if synced && (second != 409 || runs.Load() != 1) {
				t.Fatalf("synced clocks: the duplicate on the skewed process got %d and the work ran %d times; want 409 and once", second, runs.Load())
			}
			if !synced && runs.Load() != 2 {
				t.Fatalf("control: raw skewed clocks should take a live lease over (the hazard the synced clock removes); runs %d", runs.Load())
			}
		})
	}
}
