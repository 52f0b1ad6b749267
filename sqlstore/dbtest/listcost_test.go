package dbtest_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/core/store"
	"github.com/idemkit/idem/sqlstore"
)

// TestListCost measures what an operator's listing (store.Inspector.List)
// costs on a table of many completed records, which no index on state
// helps (docs/decisions.md, "An operator's view"): the first page of the
// few indeterminate records, and pages of completed ones at the start of
// the table and after a cursor. It is a measurement, not a check: it runs
// only when IDEM_LIST_ROWS is set ("200000": the completed records), on
// IDEM_SCALE_DIALECTS ("postgres,mysql" by default), and logs its results
// (go test -v). The tables (idem_list_<rows>) are dropped afterwards.
func TestListCost(t *testing.T) {
	n, err := strconv.ParseInt(os.Getenv("IDEM_LIST_ROWS"), 10, 64)
	if err != nil || n < 1000 {
		t.Skip("IDEM_LIST_ROWS not set (a measurement: see docs/decisions.md)")
	}
	dialects := os.Getenv("IDEM_SCALE_DIALECTS")
	if dialects == "" {
		dialects = "postgres,mysql"
	}
	for _, name := range strings.Split(dialects, ",") {
		t.Run(name, func(t *testing.T) {
			d, driver, env := sqlstore.Postgres, "pgx", "IDEM_TEST_POSTGRES_DSN"
			if name == "mysql" {
				d, driver, env = sqlstore.MySQL, "mysql", "IDEM_TEST_MYSQL_DSN"
			}
			dsn := os.Getenv(env)
			if dsn == "" {
				t.Skipf("%s not set", env)
			}
			db, err := sql.Open(driver, dsn)
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			ctx := context.Background()
			table := fmt.Sprintf("idem_list_%d", n)
			st, err := sqlstore.New(db, d, sqlstore.WithTable(table))
			if err != nil {
				t.Fatal(err)
			}
			_, _ = db.ExecContext(ctx, "DROP TABLE IF EXISTS "+table)
			if err := st.Migrate(ctx); err != nil {
				t.Fatal(err)
			}
			defer func() { _, _ = db.ExecContext(ctx, "DROP TABLE IF EXISTS "+table) }()
			start := time.Now()
			scaleLoad(t, db, d, table, 1, n, false)
			if d == sqlstore.Postgres {
				if _, err := db.ExecContext(ctx, "ANALYZE "+table); err != nil {
					t.Fatal(err)
				}
			}
			t.Logf("%v: loaded %d completed records in %v", d, n, time.Since(start).Round(time.Second))
			now := time.Now()
			for i := range 20 {
				id := store.Identity{Key: fmt.Sprintf("stuck-%d", i)}.ID()
				if _, err := st.Claim(ctx, store.ClaimRequest{ID: id, Token: int64(i + 1), Now: now, LeaseUntil: now.Add(time.Second), ExpiresAt: now.Add(time.Hour)}); err != nil {
					t.Fatal(err)
				}
				if err := st.Complete(ctx, id, int64(i+1), store.Completion{State: store.StateIndeterminate, Status: 502, ExpiresAt: now.Add(time.Hour)}); err != nil {
					t.Fatal(err)
				}
			}
			measure := func(what string, q store.ListQuery, want int) {
				var times []time.Duration
				for range 7 {
					began := time.Now()
					recs, err := st.List(ctx, q)
					times = append(times, time.Since(began))
					if err != nil || len(recs) != want {
						t.Fatalf("%s: %d records, %v; want %d", what, len(recs), err, want)
					}
				}
				slices.Sort(times)
				t.Logf("%v, %d records: %s: median %v (min %v, max %v)", d, n, what,
					times[len(times)/2].Round(100*time.Microsecond), times[0].Round(100*time.Microsecond), times[len(times)-1].Round(100*time.Microsecond))
			}
			now = time.Now()
			measure("indeterminate, limit 100 (20 of them)", store.ListQuery{State: store.StateIndeterminate, Now: now, Limit: 100}, 20)
			first, err := st.List(ctx, store.ListQuery{State: store.StateCompleted, Now: now, Limit: 100})
			if err != nil {
				t.Fatal(err)
			}
			measure("completed, first page of 100", store.ListQuery{State: store.StateCompleted, Now: now, Limit: 100}, 100)
			measure("completed, the page after the first", store.ListQuery{State: store.StateCompleted, Now: now, Limit: 100, After: store.CursorOf(first[len(first)-1])}, 100)
		})
	}
}
