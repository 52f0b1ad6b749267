package reliability

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/core/store"
	"github.com/idemkit/idem/sqlstore"
)

// Regression tests for bugs these tests found; each says what the bug was.

// TestMariaDBSweepNeverDeadlocksWriters is the regression test of a bug
// the linearizability test found in sqlstore (mysql.go, DeleteExpired),
// fixed in ae303c9.
//
// DeleteExpired on MySQL/MariaDB locked its batch with
//
//	SELECT id FROM t WHERE expires_at <= ? ORDER BY expires_at LIMIT ? FOR UPDATE SKIP LOCKED
//
// which MariaDB answers from the covering secondary index
// <table>_expires_at_idx, locking the index entries only, then deleted the
// rows by primary key. A concurrent Claim (probe FOR UPDATE NOWAIT on the
// primary key, then UPDATE of expires_at), Complete, Extend or Release
// locks the primary key first and the index entry second: the opposite
// order, so the two deadlocked (Error 1213) and InnoDB killed one of them,
// often the claim or the completion, a 503 for live traffic (the contract,
// section 6: sweeping never blocks live traffic).
func TestMariaDBSweepNeverDeadlocksWriters(t *testing.T) {
	d := sqlstore.MySQL
	db := openDB(t, d, dsn(t, d))
	s := newSQLStore(t, d, db, nil)
	ctx := context.Background()
	base := time.Date(2031, 1, 1, 0, 0, 0, 0, time.UTC)
	const keys = 64
	ids := make([]store.ID, keys)
	tokens := make([]atomic.Int64, keys)
	for i := range ids {
		ids[i] = store.Identity{Caller: "deadlock", Scope: "s", Key: fmt.Sprint(i)}.ID()
	}
	var clock atomic.Int64 // ms after base
	now := func() time.Time { return base.Add(time.Duration(clock.Load()) * time.Millisecond) }
	var (
		deadlocks, writes, writerVictims atomic.Int64
		firstErr                         atomic.Value
		wg                               sync.WaitGroup
		stop                             = time.Now().Add(3 * time.Second)
	)
	deadlock := func(err error) bool {
		if err != nil && strings.Contains(err.Error(), "1213") {
			deadlocks.Add(1)
			firstErr.CompareAndSwap(nil, err.Error())
			return true
		}
		return false
	}
	for w := range 4 { // writers: claim expired records again, complete them
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			for time.Now().Before(stop) {
				k := rng.IntN(keys)
				n := now()
				tok := int64(rng.Uint64()>>2) + 1
				res, err := s.Claim(ctx, store.ClaimRequest{ID: ids[k], Caller: "deadlock", Scope: "s", Key: fmt.Sprint(k),
					Token: tok, Now: n, LeaseUntil: n.Add(50 * time.Millisecond), ExpiresAt: n.Add(100 * time.Millisecond), Takeover: true})
				writes.Add(1)
				if deadlock(err) {
					writerVictims.Add(1)
				}
				if err != nil {
					continue
				}
				if res.Claimed {
					tokens[k].Store(tok)
					err = s.Complete(ctx, ids[k], tok, store.Completion{State: store.StateCompleted, Status: 201,
						Response: []byte("ok"), ExpiresAt: n.Add(time.Duration(50+rng.IntN(100)) * time.Millisecond)})
					writes.Add(1)
					if deadlock(err) {
						writerVictims.Add(1)
					}
				}
			}
		}()
	}
	wg.Add(2)
	go func() { // time passes: everything expires within a few ticks
		defer wg.Done()
		for time.Now().Before(stop) {
			clock.Add(20)
			time.Sleep(time.Millisecond)
		}
	}()
	go func() { // the sweeper
		defer wg.Done()
		for time.Now().Before(stop) {
			_, err := s.DeleteExpired(ctx, now(), 16)
			if err != nil && !deadlock(err) && !errors.Is(err, context.Canceled) {
				t.Errorf("DeleteExpired: %v", err)
				return
			}
		}
	}()
	wg.Wait()
	t.Logf("%d writes, %d deadlocks, %d of them killed a claim or completion", writes.Load(), deadlocks.Load(), writerVictims.Load())
	if n := deadlocks.Load(); n > 0 {
		t.Errorf("%d deadlocks (Error 1213) between DeleteExpired and claims/completions in 2 s (%d killed a claim or completion: a 503 for live traffic); first: %v",
			n, writerVictims.Load(), firstErr.Load())
	}
}
