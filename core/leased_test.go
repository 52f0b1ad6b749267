package core_test

import (
	"context"
	"errors"
	"testing"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/memstore"
)

// A leased Once inside a transaction of the store (the memory store's
// atomic view here; sqlstoretest.RunLifetime does it on real databases)
// writes its record outside that transaction: fn sees the caller's
// transaction, the caller rolls back, and the redelivery finds the record
// indeterminate instead of running fn again.
func TestLeasedOnceOutsideTheCallersTransaction(t *testing.T) {
	st := memstore.New().Atomic()
	e, err := core.New(st, quiet, core.WithSingleCaller())
	if err != nil {
		t.Fatal(err)
	}
	msg := core.Message{Consumer: "payments", ID: "m1"}
	runs := 0
	deliver := func() error {
		ctx, tx, err := st.Begin(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = tx.Rollback() }() // the consumer nacks
		_, err = e.Once(ctx, msg, func(ctx context.Context) ([]byte, error) {
			runs++
			if !st.InTx(ctx) {
				t.Error("fn's context lost the caller's transaction")
			}
			core.MarkEffect(ctx)
			return nil, errors.New("the provider timed out")
		}, core.Leased())
		return err
	}
	if err := deliver(); err == nil || errors.Is(err, core.ErrIndeterminate) {
		t.Fatalf("first delivery: %v, want fn's error", err)
	}
	if err := deliver(); !errors.Is(err, core.ErrIndeterminate) {
		t.Fatalf("redelivery after the caller's rollback: %v, want ErrIndeterminate", err)
	}
	if runs != 1 {
		t.Fatalf("fn ran %d times, want 1", runs)
	}
}

// A leased Once whose fn fails before MarkEffect releases the record:
// the redelivery runs again (the same rule as a leased 5xx before
// MarkEffect).
func TestLeasedOnceErrorBeforeEffectReleases(t *testing.T) {
	e, err := core.New(memstore.New(), quiet, core.WithSingleCaller())
	if err != nil {
		t.Fatal(err)
	}
	msg := core.Message{Consumer: "payments", ID: "m2"}
	runs := 0
	fn := func(ctx context.Context) ([]byte, error) {
		runs++
		if runs == 1 {
			return nil, errors.New("the database is down")
		}
		return []byte("done"), nil
	}
	if _, err := e.Once(context.Background(), msg, fn); err == nil {
		t.Fatal("first delivery succeeded")
	}
	res, err := e.Once(context.Background(), msg, fn)
	if err != nil || res.Replayed || string(res.Value) != "done" || runs != 2 {
		t.Fatalf("redelivery: %+v, %v after %d runs; want fn to run again", res, err, runs)
	}
}
