package sqlstore_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/core"
)

// Sweeping never fails live traffic: while DeleteExpired deletes batches of
// expired records, concurrent claims (of expired records, so they replace
// what the sweep deletes), completions and a second sweeper all succeed, on
// every database. (On MySQL/MariaDB a sweep that locked its batch through
// the expires_at index deadlocked with claims; see mysql.go.)
func TestSweepNeverFailsWriters(t *testing.T) {
	for _, d := range dialects {
		t.Run(d.String(), func(t *testing.T) {
			s, _, _ := newStore(t, d)
			ctx := context.Background()
			base := time.Date(2031, 1, 1, 0, 0, 0, 0, time.UTC)
			const keys = 64
			ids := make([]core.ID, keys)
			for i := range ids {
				ids[i] = core.Identity{Caller: "sweep", Scope: "s", Key: fmt.Sprint(i)}.ID()
			}
			var (
				clock                     atomic.Int64 // ms after base
				writes, swept, busy, errs atomic.Int64
				first                     atomic.Value
				wg                        sync.WaitGroup
			)
			now := func() time.Time { return base.Add(time.Duration(clock.Load()) * time.Millisecond) }
			fail := func(what string, err error) {
				errs.Add(1)
				first.CompareAndSwap(nil, fmt.Sprintf("%s: %v", what, err))
			}
			stop := time.Now().Add(1500 * time.Millisecond)
			for w := range 4 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					rng := rand.New(rand.NewPCG(uint64(w), 11))
					for time.Now().Before(stop) {
						k, n, tok := rng.IntN(keys), now(), int64(rng.Uint64()>>2)+1
						res, err := s.Claim(ctx, core.ClaimRequest{ID: ids[k], Caller: "sweep", Scope: "s", Key: fmt.Sprint(k),
							Token: tok, Now: n, LeaseUntil: n.Add(50 * time.Millisecond), ExpiresAt: n.Add(100 * time.Millisecond), Takeover: true})
						writes.Add(1)
						switch {
						case err != nil:
							fail("claim", err)
						case res.Claimed:
							err := s.Complete(ctx, ids[k], tok, core.Completion{State: core.StateCompleted, Status: 201,
								Response: []byte("ok"), ExpiresAt: n.Add(time.Duration(50+rng.IntN(100)) * time.Millisecond)})
							writes.Add(1)
							if err != nil && err != core.ErrFenced {
								fail("complete", err)
							}
						case res.Record.Token == 0:
							busy.Add(1) // held by another transaction right now
						}
					}
				}()
			}
			wg.Add(3)
			go func() { // time passes: everything expires within a few ticks
				defer wg.Done()
				for time.Now().Before(stop) {
					clock.Add(20)
					time.Sleep(time.Millisecond)
				}
			}()
			for range 2 { // two sweepers
				go func() {
					defer wg.Done()
					for time.Now().Before(stop) {
						n, err := s.DeleteExpired(ctx, now(), 16)
						if err != nil {
							fail("sweep", err)
						}
						swept.Add(int64(n))
					}
				}()
			}
			wg.Wait()
			t.Logf("%v: %d writes, %d records swept, %d claims answered in progress, %d errors", d, writes.Load(), swept.Load(), busy.Load(), errs.Load())
			if errs.Load() > 0 {
				t.Fatalf("%d failed calls while sweeping; first: %v", errs.Load(), first.Load())
			}
		})
	}
}
