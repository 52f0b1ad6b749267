package dbtest_test

import (
	"context"
	"testing"
	"time"

	"github.com/idemkit/idem/core/syncclock"
)

// The database clock agrees with this host's (same machine) within a
// generous bound, and a synced clock over a skewed local clock follows the
// database, not the skew.
func TestNowReadsTheDatabaseClock(t *testing.T) {
	for _, d := range dialects {
		t.Run(d.String(), func(t *testing.T) {
			st, _, _ := newStore(t, d)
			ctx := context.Background()
			before := time.Now()
			got, err := st.Now(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if d := got.Sub(before); d < -2*time.Second || d > 2*time.Second {
				t.Fatalf("database clock %v is %v away from the host's %v", got, d, before)
			}
			c, err := syncclock.New(ctx, st, time.Hour)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Stop()
			if d := c.Now().Sub(time.Now()); d < -2*time.Second || d > 2*time.Second {
				t.Fatalf("synced clock is %v off", d)
			}
		})
	}
}
