package memstore_test

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/memstore"
	"github.com/idemkit/idem/core/store"
	"github.com/idemkit/idem/core/storetest"
)

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store { return memstore.New() })
}

func TestConformanceAtomic(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store { return memstore.New().Atomic() })
}

func BenchmarkStore(b *testing.B) {
	storetest.Bench(b, func(b *testing.B) store.Store { return memstore.New() })
}

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func claim(id byte, token int64) store.ClaimRequest {
	return store.ClaimRequest{
		ID: store.ID{id}, Token: token, Now: t0,
		LeaseUntil: t0.Add(30 * time.Second), ExpiresAt: t0.Add(time.Hour),
	}
}

func TestLen(t *testing.T) {
	ctx := t.Context()
	s := memstore.New()
	for i := range 100 {
		if _, err := s.Claim(ctx, claim(byte(i), 1)); err != nil {
			t.Fatal(err)
		}
	}
	if n := s.Len(); n != 100 {
		t.Fatalf("Len = %d, want 100", n)
	}
	// Expired records count until they are deleted.
	if _, err := s.Get(ctx, store.ID{0}, t0.Add(2*time.Hour)); !errors.Is(err, core.ErrNotFound) {
		t.Fatalf("Get of an expired record: %v, want ErrNotFound", err)
	}
	if n := s.Len(); n != 100 {
		t.Fatalf("Len with expired records = %d, want 100", n)
	}
	if n, err := s.DeleteExpired(ctx, t0.Add(2*time.Hour), 1000); n != 100 || err != nil {
		t.Fatalf("DeleteExpired = (%d, %v), want (100, nil)", n, err)
	}
	if n := s.Len(); n != 0 {
		t.Fatalf("Len after DeleteExpired = %d, want 0", n)
	}
}

func TestInvalidArguments(t *testing.T) {
	ctx := t.Context()
	s := memstore.New()
	if _, err := s.Claim(ctx, claim(1, 0)); err == nil {
		t.Error("Claim with token 0: no error")
	}
	if _, err := s.Claim(ctx, claim(1, 7)); err != nil {
		t.Fatal(err)
	}
	err := s.Complete(ctx, store.ID{1}, 7, store.Completion{State: store.StateInProgress, ExpiresAt: t0.Add(time.Hour)})
	if err == nil || errors.Is(err, core.ErrFenced) {
		t.Errorf("Complete with StateInProgress: %v, want an argument error", err)
	}
	if n, err := s.DeleteExpired(ctx, t0.Add(2*time.Hour), 0); n != 0 || err != nil {
		t.Errorf("DeleteExpired with limit 0 = (%d, %v), want (0, nil)", n, err)
	}
}

func TestCancelledContextError(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	_, err := memstore.New().Get(ctx, store.ID{1}, t0)
	if !errors.Is(err, core.ErrStoreUnavailable) || !errors.Is(err, context.Canceled) {
		t.Errorf("Get with a cancelled context: %v, want ErrStoreUnavailable and context.Canceled", err)
	}
}

func TestAtomicSharesRecords(t *testing.T) {
	ctx := t.Context()
	s := memstore.New()
	a := s.Atomic()
	if _, err := a.Claim(ctx, claim(1, 7)); err != nil {
		t.Fatal(err)
	}
	if r, err := s.Get(ctx, store.ID{1}, t0); err != nil || r.Token != 7 {
		t.Errorf("Get on the plain view = (%v, %v), want the record claimed through the atomic view", r.Token, err)
	}
	tctx, tx, err := a.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if !s.Atomic().InTx(tctx) {
		t.Error("InTx of another atomic view of the same Store = false, want true")
	}
	if memstore.New().Atomic().InTx(tctx) {
		t.Error("InTx of another Store = true, want false")
	}
	// The plain view's methods run in the transaction too.
	if _, err := s.Claim(tctx, claim(2, 8)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(ctx, store.ID{2}, t0); !errors.Is(err, core.ErrNotFound) {
		t.Errorf("Get outside the transaction: %v, want ErrNotFound", err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(ctx, store.ID{2}, t0); err != nil {
		t.Errorf("Get after Commit: %v", err)
	}
}

func TestTxLifecycle(t *testing.T) {
	ctx := t.Context()
	a := memstore.New().Atomic()
	tctx, tx, err := a.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := a.Begin(tctx); err == nil {
		t.Error("nested Begin: no error")
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	for name, err := range map[string]error{
		"second Commit":         tx.Commit(),
		"Rollback after Commit": tx.Rollback(),
	} {
		if !errors.Is(err, memstore.ErrTxDone) {
			t.Errorf("%s: %v, want ErrTxDone", name, err)
		}
	}
	if _, err := a.Claim(tctx, claim(1, 7)); !errors.Is(err, memstore.ErrTxDone) {
		t.Errorf("Claim with the context of a committed transaction: %v, want ErrTxDone", err)
	}
	if _, err := a.Get(tctx, store.ID{1}, t0); !errors.Is(err, memstore.ErrTxDone) {
		t.Errorf("Get with the context of a committed transaction: %v, want ErrTxDone", err)
	}
	if n := a.Len(); n != 0 {
		t.Errorf("Len = %d, want 0", n)
	}
}

func TestTxRolledBackWhenContextEnds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		s := memstore.New()
		a := s.Atomic()
		tctx, tx, err := a.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := a.Claim(tctx, claim(1, 7)); err != nil {
			t.Fatal(err)
		}
		cancel()
		synctest.Wait() // the rollback runs in its own goroutine
		if n := s.Len(); n != 0 {
			t.Errorf("Len after the context ended = %d, want 0: not rolled back", n)
		}
		if err := tx.Commit(); !errors.Is(err, memstore.ErrTxDone) {
			t.Errorf("Commit after the context ended: %v, want ErrTxDone", err)
		}
	})
}

func TestTxReleaseRollsBack(t *testing.T) {
	ctx := t.Context()
	a := memstore.New().Atomic()
	if _, err := a.Claim(ctx, claim(1, 7)); err != nil {
		t.Fatal(err)
	}
	tctx, tx, err := a.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Release(tctx, store.ID{1}, 7); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Get(tctx, store.ID{1}, t0); !errors.Is(err, core.ErrNotFound) {
		t.Errorf("Get in the transaction after Release: %v, want ErrNotFound", err)
	}
	if r, err := a.Get(ctx, store.ID{1}, t0); err != nil || r.Token != 7 {
		t.Errorf("Get outside the transaction = (%v, %v), want the committed record", r.Token, err)
	}
	if err := a.Release(ctx, store.ID{1}, 7); !errors.Is(err, core.ErrFenced) {
		t.Errorf("Release outside the transaction of a record it holds: %v, want ErrFenced", err)
	}
	if n, err := a.DeleteExpired(ctx, t0.Add(2*time.Hour), 10); n != 0 || err != nil {
		t.Errorf("DeleteExpired of a record held by a transaction = (%d, %v), want (0, nil)", n, err)
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	if r, err := a.Get(ctx, store.ID{1}, t0); err != nil || r.Token != 7 {
		t.Errorf("Get after Rollback = (%v, %v), want the record back", r.Token, err)
	}
}
