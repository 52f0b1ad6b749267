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
	"github.com/idemkit/idem/core/store"
)

// expiries is a memory store (atomic or leased) that remembers the
// ExpiresAt of the last claim and of the last completion.
type expiries struct {
	store.Store
	mu              sync.Mutex
	claim, complete time.Time
}

func (s *expiries) Claim(ctx context.Context, req store.ClaimRequest) (store.ClaimResult, error) {
	s.mu.Lock()
	s.claim = req.ExpiresAt
	s.mu.Unlock()
	return s.Store.Claim(ctx, req)
}

func (s *expiries) Complete(ctx context.Context, id store.ID, token int64, c store.Completion) error {
	s.mu.Lock()
	s.complete = c.ExpiresAt
	s.mu.Unlock()
	return s.Store.Complete(ctx, id, token, c)
}

type atomicExpiries struct {
	*expiries
	tx *memstore.AtomicStore
}

func (s atomicExpiries) Begin(ctx context.Context) (context.Context, store.Tx, error) {
	return s.tx.Begin(ctx)
}
func (s atomicExpiries) InTx(ctx context.Context) bool { return s.tx.InTx(ctx) }
func (s atomicExpiries) WithoutTx(ctx context.Context) context.Context {
	return s.tx.WithoutTx(ctx)
}

// TestCompletionExpiry: in atomic mode the completion keeps the claim's
// ExpiresAt (the retention counts from the claim; claim and completion are
// one transaction, and on Postgres an unchanged expires_at makes the
// completion an in-place HOT update), unless the retention ran out while
// the handler ran; in leased mode the retention counts from the
// completion.
func TestCompletionExpiry(t *testing.T) {
	for _, tc := range []struct {
		name      string
		atomic    bool
		retention time.Duration
		work      time.Duration // the handler's time on the engine's clock
		fromClaim bool
	}{
		{"Atomic_KeepsTheClaimsExpiry", true, time.Hour, time.Second, true},
		{"Atomic_RetentionShorterThanTheHandler_FromNow", true, time.Second, 2 * time.Second, false},
		{"Leased_FromTheCompletion", false, time.Hour, time.Second, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var (
				mu  sync.Mutex
				now = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
			)
			clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
			mem := memstore.New()
			rec := &expiries{Store: mem}
			var store store.Store = rec
			if tc.atomic {
				store = atomicExpiries{expiries: rec, tx: mem.Atomic()}
				rec.Store = mem.Atomic()
			}
			opts := []core.RouteOption{core.Retention(tc.retention)}
			if !tc.atomic {
				opts = append(opts, core.Leased())
			}
			e, err := core.New(store, core.WithSingleCaller(), core.WithClock(clock), quiet)
			if err != nil {
				t.Fatal(err)
			}
			var atomic bool
			h := e.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				info, _ := core.AttemptFrom(r.Context())
				atomic = info.Atomic
				mu.Lock()
				now = now.Add(tc.work)
				mu.Unlock()
				w.WriteHeader(http.StatusCreated)
			}), opts...)
			r := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader(`{}`))
			r.Header.Set("Idempotency-Key", "k1")
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			if w.Code != http.StatusCreated {
				t.Fatalf("status %d: %s", w.Code, w.Body)
			}
			if atomic != tc.atomic {
				t.Fatalf("route atomic = %v, want %v", atomic, tc.atomic)
			}
			want := clock().Add(tc.retention)
			if tc.fromClaim {
				want = rec.claim
			}
			if !rec.complete.Equal(want) {
				t.Errorf("completion ExpiresAt = %s, want %s (claim's: %s, completion time + retention: %s)",
					rec.complete, want, rec.claim, clock().Add(tc.retention))
			}
		})
	}
}
