package syncclock

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/idemkit/idem/core"
)

// dbClock is the shared clock all processes sample (the database's).
type dbClock struct{ fail atomic.Bool }

func (d *dbClock) Now(context.Context) (time.Time, error) {
	if d.fail.Load() {
		return time.Time{}, errors.New("connection refused")
	}
	return time.Now(), nil
}

func TestClockAgreesDespiteSkew(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := &dbClock{}
		ahead, err := newClock(t.Context(), src, time.Second, func() time.Time { return time.Now().Add(7 * time.Second) })
		if err != nil {
			t.Fatal(err)
		}
		defer ahead.Stop()
		behind, err := newClock(t.Context(), src, time.Second, func() time.Time { return time.Now().Add(-3 * time.Second) })
		if err != nil {
			t.Fatal(err)
		}
		defer behind.Stop()
		for range 5 {
			time.Sleep(1500 * time.Millisecond)
			if d := ahead.Now().Sub(behind.Now()); d != 0 {
				t.Fatalf("two processes skewed by 10 s disagree by %v after syncing", d)
			}
			if d := ahead.Now().Sub(time.Now()); d != 0 {
				t.Fatalf("synced clock is %v off the database's", d)
			}
		}
		src.fail.Store(true)
		time.Sleep(1500 * time.Millisecond)
		if d := ahead.Now().Sub(time.Now()); d != 0 {
			t.Fatalf("a failed sample must keep the last offset, off by %v", d)
		}
		if off, _ := ahead.Offset(); off != -7*time.Second {
			t.Fatalf("Offset() = %v, want -7s", off)
		}
	})
}

func TestClockFailsWithoutASource(t *testing.T) {
	src := &dbClock{}
	src.fail.Store(true)
	if _, err := New(context.Background(), src, 0); !errors.Is(err, core.ErrStoreUnavailable) {
		t.Fatalf("err = %v, want core.ErrStoreUnavailable", err)
	}
}
