package pgxstore_test

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"
)

// TestCompletionInPlace: in atomic mode the completion changes no indexed
// column (the engine keeps the claim's expires_at), so Postgres updates
// the record in place (a HOT update: no new index entries, one WAL record
// for the row) instead of writing a new version into both indexes. Most
// of a run of sequential first executions must be HOT (a page that has no
// room left for the new version makes an update non-HOT); before, none
// was.
func TestCompletionInPlace(t *testing.T) {
	ctx := context.Background()
	s, pool, _ := newStore(t)
	p := newPayment(t, pool, s.Table())
	h := protectedPayment(t, s, p, nil, nil)
	const n = 20
	for i := range n {
		if w := serve(h, fmt.Sprint("hot-", i)); w.Code != http.StatusCreated {
			t.Fatalf("request %d: %d %s", i, w.Code, w.Body)
		}
	}
	// Backends report their table statistics within about a second of
	// going idle.
	var upd, hot int64
	deadline := time.Now().Add(20 * time.Second)
	for {
		err := pool.QueryRow(ctx, `SELECT pg_stat_clear_snapshot()::text || '', n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relname = $1`, s.Table()).
			Scan(new(string), &upd, &hot)
		if err != nil {
			t.Fatal(err)
		}
		if upd >= n || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond) // polling the statistics, not a latency assertion
	}
	if upd < n {
		t.Fatalf("the table's statistics show %d updates after %d completions", upd, n)
	}
	if hot*2 <= upd {
		t.Errorf("%d of %d completions were HOT updates, want most", hot, upd)
	}
	t.Logf("%d of %d completions were HOT updates", hot, upd)
}
