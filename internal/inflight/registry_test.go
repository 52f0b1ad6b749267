package inflight

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/idemkit/idem/core/store"
)

// TestEnterPastClaimWait: a claim that waited ClaimWait for another claim
// statement of its id answers from the committed record when peek finds it
// final, and in progress only when peek finds nothing final or cannot
// read; never in progress for a completed record (the registry once
// answered in progress without looking, and retries of a completed request
// got 409 under load).
func TestEnterPastClaimWait(t *testing.T) {
	now := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	completed := &store.Record{State: store.StateCompleted, Status: 201, Response: []byte("ok"), ExpiresAt: now.Add(time.Hour)}
	for _, tc := range []struct {
		name     string
		peek     Peek
		wantHeld bool
		wantRec  bool
	}{
		{"ok, a completed record: the replay", func(context.Context) (*store.Record, error) { return completed, nil }, false, true},
		{"ok, nothing final: in progress", func(context.Context) (*store.Record, error) { return nil, nil }, true, false},
		{"ok, the peek fails (no connection): in progress", func(context.Context) (*store.Record, error) { return nil, errors.New("pool busy") }, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var r Registry[int]
				id := store.ID{1}
				leader, held, _, err := r.Enter(t.Context(), id, 1, true, now, nil)
				if leader == nil || held || err != nil {
					t.Fatalf("leader: %v, %v, %v", leader, held, err)
				}
				peeked := false
				_, held, found, err := r.Enter(t.Context(), id, 2, true, now, func(ctx context.Context) (*store.Record, error) {
					peeked = true
					return tc.peek(ctx)
				})
				if err != nil || !peeked || held != tc.wantHeld || (found != nil) != tc.wantRec {
					t.Fatalf("waiter: held %v, found %+v, err %v, peeked %v; want held %v, a record %v", held, found, err, peeked, tc.wantHeld, tc.wantRec)
				}
				if found != nil && (found.State != store.StateCompleted || string(found.Response) != "ok") {
					t.Fatalf("waiter: %+v, want the completed record", found)
				}
				r.Settle(leader, id, false, completed)
			})
		})
	}
	t.Run("ok, the waiter's context ends during the peek: its error", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			var r Registry[int]
			id := store.ID{1}
			leader, _, _, _ := r.Enter(t.Context(), id, 1, true, now, nil)
			ctx, cancel := context.WithCancel(t.Context())
			_, held, found, err := r.Enter(ctx, id, 2, true, now, func(context.Context) (*store.Record, error) {
				cancel()
				return nil, context.Canceled
			})
			if !errors.Is(err, context.Canceled) || held || found != nil {
				t.Fatalf("waiter: held %v, found %+v, err %v; want context.Canceled", held, found, err)
			}
			r.Settle(leader, id, false, nil)
		})
	})
	t.Run("ok, a statement that answers within ClaimWait is shared without a peek", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			var r Registry[int]
			id := store.ID{1}
			leader, _, _, _ := r.Enter(t.Context(), id, 1, true, now, nil)
			go func() {
				time.Sleep(ClaimWait / 2)
				r.Settle(leader, id, false, completed)
			}()
			_, held, found, err := r.Enter(t.Context(), id, 2, true, now, func(context.Context) (*store.Record, error) {
				t.Error("peeked")
				return nil, nil
			})
			if err != nil || held || found == nil || found == completed || string(found.Response) != "ok" {
				t.Fatalf("waiter: held %v, found %+v, err %v; want a copy of the completed record", held, found, err)
			}
		})
	})
}
