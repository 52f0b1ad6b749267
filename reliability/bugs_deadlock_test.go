package reliability

import (
	"context"
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

// TestMariaDBClaimOverDeletedRowRetries: regression test of a bug in
// sqlstore on MySQL/MariaDB (mysql.go, claimMySQLIn: the INSERT of a
// claim), found by the linearizability test.
//
// When a record was just deleted (Release, or a sweep), a claim's probe
// (SELECT ... FOR UPDATE NOWAIT) finds nothing and the claim INSERTs the
// id. InnoDB's duplicate check meets the delete-marked record and takes a
// shared lock on it, then needs an exclusive one. A fenced writer of the
// same id that arrives in between (Extend, Complete or Release by primary
// key: "UPDATE ... WHERE id = ? AND token = ?") queues for the exclusive
// lock behind the shared one, and the claim's upgrade then waits behind the
// writer: deadlock (Error 1213). InnoDB kills one of them: the claim (a 503
// for a request that should have run), or the writer (a completion that is
// not recorded, a heartbeat that fails, a release that does not happen).
//
// Fixed: statements that run outside a caller's transaction (leased claims
// in their short transaction, Extend, Complete, Release) retry a deadlock
// victim (the victim was rolled back, so the retry is safe), and so does a
// claim that is the first statement of Begin's transaction (InnoDB rolled
// back a transaction that held only the claim: the store begins it again):
// no store error may reach the caller.
func TestMariaDBClaimOverDeletedRowRetries(t *testing.T) {
	d := sqlstore.MySQL
	s := newSQLStore(t, d, openDB(t, d, dsn(t, d)), nil)
	ctx := context.Background()
	now := time.Date(2031, 1, 1, 0, 0, 0, 0, time.UTC)
	const keys = 4
	ids := make([]store.ID, keys)
	for i := range ids {
		ids[i] = store.Identity{Caller: "dl", Scope: "s", Key: fmt.Sprint(i)}.ID()
	}
	var (
		deadlocks, ops atomic.Int64
		first          atomic.Value
		victimsMu      sync.Mutex
		victims        = map[string]int{}
		wg             sync.WaitGroup
		stop           = time.Now().Add(3 * time.Second)
	)
	check := func(op string, err error) {
		ops.Add(1)
		if err != nil && strings.Contains(err.Error(), "1213") {
			deadlocks.Add(1)
			first.CompareAndSwap(nil, op+": "+err.Error())
			victimsMu.Lock()
			victims[op]++
			victimsMu.Unlock()
		}
	}
	for w := range 3 { // claim, then release: the id is deleted and inserted again and again
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 1))
			for time.Now().Before(stop) {
				k := rng.IntN(keys)
				tok := int64(rng.Uint64()>>2) + 1
				req := store.ClaimRequest{ID: ids[k], Caller: "dl", Scope: "s", Key: fmt.Sprint(k), Token: tok,
					Now: now, LeaseUntil: now.Add(time.Minute), ExpiresAt: now.Add(time.Hour), Takeover: true}
				if w == 0 { // leased: the claim commits at once
					res, err := s.Claim(ctx, req)
					check("claim", err)
					if err == nil && res.Claimed {
						check("release", s.Release(ctx, ids[k], tok))
					}
					continue
				}
				// atomic: claim and release in one transaction (a caller
				// that releases, then commits)
				req.LeaseUntil = time.Time{}
				tctx, tx, err := s.Begin(ctx)
				if err != nil {
					t.Error(err)
					return
				}
				res, err := s.Claim(tctx, req)
				check("claim in a transaction", err)
				if err == nil && res.Claimed {
					err = s.Release(tctx, ids[k], tok)
					check("release in a transaction", err)
				}
				if err == nil {
					check("commit", tx.Commit())
				} else {
					_ = tx.Rollback()
				}
			}
		}()
	}
	for w := range 3 { // stale attempts: fenced writers of the same ids
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 2))
			for time.Now().Before(stop) {
				k, tok := rng.IntN(keys), int64(rng.Uint64()>>2)+1
				switch rng.IntN(3) {
				case 0:
					check("extend", s.Extend(ctx, ids[k], tok, now.Add(time.Minute)))
				case 1:
					check("complete", s.Complete(ctx, ids[k], tok, store.Completion{State: store.StateCompleted, Status: 201, ExpiresAt: now.Add(time.Hour)}))
				default:
					check("release", s.Release(ctx, ids[k], tok))
				}
			}
		}()
	}
	wg.Wait()
	t.Logf("%d operations, %d deadlocks; victims: %v", ops.Load(), deadlocks.Load(), victims)
	if n := deadlocks.Load(); n > 0 {
		t.Errorf("BUG: %d deadlocks (Error 1213) between claims of just-deleted ids and fenced writers in 3 s; first: %v", n, first.Load())
	}
}
