package dbtest_test

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/store"
	"github.com/idemkit/idem/sqlstore"
)

// TestScale measures, in atomic mode, the claim latency of a table holding
// a small and a large number of records, and the sweep's throughput with
// live traffic. It is a measurement, not a check: it runs only when
// IDEM_SCALE_ROWS is set ("10000,10000000": the small and the large table)
// and logs its results (go test -v). IDEM_SCALE_DIALECTS selects
// "postgres,mysql" (default both). The tables (idem_scale_<rows>) are kept,
// so a later run reuses them (the records the latency rounds add are
// counted, so a table is reloaded when its count differs from the size by
// more than that). See BENCHMARKS.md.
func TestScale(t *testing.T) {
	sizes := os.Getenv("IDEM_SCALE_ROWS")
	if sizes == "" {
		t.Skip("IDEM_SCALE_ROWS not set (a measurement: see BENCHMARKS.md)")
	}
	var rows []int64
	for _, f := range strings.Split(sizes, ",") {
		n, err := strconv.ParseInt(strings.TrimSpace(f), 10, 64)
		if err != nil || n < 1000 {
			t.Fatalf("IDEM_SCALE_ROWS: %q", f)
		}
		rows = append(rows, n)
	}
	dialects := os.Getenv("IDEM_SCALE_DIALECTS")
	if dialects == "" {
		dialects = "postgres,mysql"
	}
	for _, name := range strings.Split(dialects, ",") {
		t.Run(name, func(t *testing.T) {
			var d sqlstore.Dialect
			var driver, env string
			switch name {
			case "postgres":
				d, driver, env = sqlstore.Postgres, "pgx", "IDEM_TEST_POSTGRES_DSN"
			case "mysql":
				d, driver, env = sqlstore.MySQL, "mysql", "IDEM_TEST_MYSQL_DSN"
			default:
				t.Fatalf("IDEM_SCALE_DIALECTS: %q", name)
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
			db.SetMaxOpenConns(8)
			db.SetMaxIdleConns(8)
			stores := make([]*sqlstore.Store, len(rows))
			for i, n := range rows {
				stores[i] = scaleTable(t, db, d, n)
			}
			// Claim latency, the sizes alternated batch by batch.
			lat := make([]scaleLatency, len(rows))
			for round := 0; round < 10; round++ {
				for i, st := range stores {
					lat[i].add(t, st, d, rows[i], 50)
				}
			}
			for i, n := range rows {
				t.Logf("%v rows=%d: %s", d, n, lat[i])
			}
			// Sweep of the largest table with live traffic.
			scaleSweep(t, db, d, stores[len(stores)-1], rows[len(rows)-1])
		})
	}
}

// scaleTable returns a store over idem_scale_<n>, loading the table first
// when it does not hold n records.
func scaleTable(t *testing.T, db *sql.DB, d sqlstore.Dialect, n int64) *sqlstore.Store {
	ctx := context.Background()
	table := fmt.Sprintf("idem_scale_%d", n)
	st, err := sqlstore.New(db, d, sqlstore.WithTable(table))
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	var have int64
	if err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM "+table).Scan(&have); err != nil {
		t.Fatal(err)
	}
	if have >= n && have <= n+10_000 { // the latency rounds add 1000 per run
		return st
	}
	if _, err := db.ExecContext(ctx, "DROP TABLE "+table); err != nil {
		t.Fatal(err)
	}
	if err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	const chunk = 500_000
	for lo := int64(1); lo <= n; lo += chunk {
		scaleLoad(t, db, d, table, lo, min(lo+chunk-1, n), false)
	}
	if d == sqlstore.Postgres {
		if _, err := db.ExecContext(ctx, "ANALYZE "+table); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("%v: loaded %d records into %s in %v", d, n, table, time.Since(start).Round(time.Second))
	return st
}

// scaleLoad inserts the records lo..hi (see loadedID), live for a day or
// expired an hour ago.
func scaleLoad(t *testing.T, db *sql.DB, d sqlstore.Dialect, table string, lo, hi int64, expired bool) {
	var q string
	switch d {
	case sqlstore.Postgres:
		exp := "now() + interval '1 day'"
		if expired {
			exp = "now() - interval '1 hour'"
		}
		q = fmt.Sprintf(`INSERT INTO %s (id, caller, scope, idem_key, fingerprint, state, token, attempt, expires_at, created_at, status, response)
			SELECT sha256(int8send(g)), 'acct_' || (g %% 1000), 'POST /orders', 'load-' || g, sha256(int8send(-g)), 2, g, 1, %s, now(), 201, $1
			FROM generate_series(%d::bigint, %d::bigint) g`, table, exp, lo, hi)
	case sqlstore.MySQL:
		exp := "UTC_TIMESTAMP(6) + INTERVAL 1 DAY"
		if expired {
			exp = "UTC_TIMESTAMP(6) - INTERVAL 1 HOUR"
		}
		// MariaDB's SEQUENCE engine: seq_A_to_B is a table of A..B. Each
		// chunk is written in primary key order.
		q = fmt.Sprintf(`INSERT INTO %s (id, caller, scope, idem_key, fingerprint, state, token, attempt, expires_at, created_at, status, response)
			SELECT UNHEX(SHA2(seq, 256)) AS h, CONCAT('acct_', seq %% 1000), 'POST /orders', CONCAT('load-', seq), UNHEX(SHA2(-seq, 256)), 2, seq, 1, %s, UTC_TIMESTAMP(6), 201, ?
			FROM seq_%d_to_%d ORDER BY h`, table, exp, lo, hi)
	}
	if _, err := db.ExecContext(context.Background(), q, scaleResponse); err != nil {
		t.Fatalf("loading %s records %d-%d: %v", table, lo, hi, err)
	}
}

// scaleResponse stands for a recorded 201 with a small JSON body.
var scaleResponse = []byte("\x01\x01\x00\xc9\x02\x0cContent-Type\x10application/json\x08Location\x0b/orders/123" +
	"\x36{\"id\":123,\"account\":\"acct_1\",\"item\":\"coffee\",\"quantity\":2}")

// loadedID is the ID of the g-th loaded record (see scaleTable).
func loadedID(d sqlstore.Dialect, g int64) store.ID {
	if d == sqlstore.MySQL {
		return sha256.Sum256([]byte(strconv.FormatInt(g, 10)))
	}
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], uint64(g))
	return sha256.Sum256(b[:])
}

type scaleLatency struct {
	claim, first, replay []time.Duration
}

func (l scaleLatency) String() string {
	q := func(ds []time.Duration) string {
		s := slices.Clone(ds)
		slices.Sort(s)
		if len(s) == 0 {
			return "-"
		}
		return fmt.Sprintf("p50 %v p90 %v p99 %v", s[len(s)/2].Round(time.Microsecond), s[len(s)*9/10].Round(time.Microsecond), s[len(s)*99/100].Round(time.Microsecond))
	}
	return fmt.Sprintf("new key: claim %s | claim+complete+commit %s; existing key (replay): claim %s (n=%d)", q(l.claim), q(l.first), q(l.replay), len(l.claim))
}

var scaleSeq atomic.Int64

// add measures n first executions (BEGIN, claim of a new identity,
// complete, COMMIT) and n replays (BEGIN, claim of a random loaded
// identity, ROLLBACK).
func (l *scaleLatency) add(t *testing.T, st *sqlstore.Store, d sqlstore.Dialect, rows int64, n int) {
	ctx := context.Background()
	now := time.Now()
	for range n {
		id := sha256.Sum256(fmt.Appendf(nil, "scale-%d-%d", time.Now().UnixNano(), scaleSeq.Add(1)))
		req := store.ClaimRequest{ID: id, Caller: "acct_1", Scope: "POST /orders", Key: "k", Token: rand.Int64N(1<<62) + 1,
			Now: now, ExpiresAt: now.Add(24 * time.Hour)}
		t0 := time.Now()
		tctx, tx, err := st.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		t1 := time.Now()
		res, err := st.Claim(tctx, req)
		if err != nil || !res.Claimed {
			t.Fatalf("claim: %+v %v", res, err)
		}
		t2 := time.Now()
		if err := st.Complete(tctx, id, req.Token, store.Completion{State: store.StateCompleted, Status: 201, Response: scaleResponse, ExpiresAt: now.Add(24 * time.Hour)}); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		l.claim = append(l.claim, t2.Sub(t1))
		l.first = append(l.first, time.Since(t0))

		g := rand.Int64N(rows) + 1
		req.ID, req.Token = loadedID(d, g), req.Token+1
		tctx, tx, err = st.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		t1 = time.Now()
		res, err = st.Claim(tctx, req)
		l.replay = append(l.replay, time.Since(t1))
		_ = tx.Rollback()
		if err != nil || res.Claimed || res.Record.State != store.StateCompleted {
			t.Fatalf("replay claim of record %d: %+v %v", g, res, err)
		}
	}
}

// scaleSweep adds sweepRows expired records to the table, then deletes
// them in batches of core.DefaultSweepBatch while two workers run first
// executions and replays, for at most a minute; it logs the rows deleted
// per second and the live traffic's latency during the sweep.
func scaleSweep(t *testing.T, db *sql.DB, d sqlstore.Dialect, st *sqlstore.Store, rows int64) {
	ctx := context.Background()
	const sweepRows, base = 100_000, 1_000_000_000_000
	scaleLoad(t, db, d, fmt.Sprintf("idem_scale_%d", rows), base+1, base+sweepRows, true)
	var live scaleLatency
	var mu sync.Mutex
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				var one scaleLatency
				one.add(t, st, d, rows, 1)
				mu.Lock()
				live.claim = append(live.claim, one.claim...)
				live.first = append(live.first, one.first...)
				live.replay = append(live.replay, one.replay...)
				mu.Unlock()
			}
		})
	}
	start := time.Now()
	deleted, batches := 0, 0
	for time.Since(start) < time.Minute {
		n, err := st.DeleteExpired(ctx, time.Now(), core.DefaultSweepBatch)
		if err != nil {
			t.Fatal(err)
		}
		deleted += n
		batches++
		if n < core.DefaultSweepBatch {
			break
		}
	}
	elapsed := time.Since(start)
	close(stop)
	wg.Wait()
	t.Logf("%v rows=%d(+%d expired): sweep deleted %d expired records in %d batches of %d in %v: %.0f rows/s; live traffic meanwhile (2 workers): %s",
		d, rows, sweepRows, deleted, batches, core.DefaultSweepBatch, elapsed.Round(time.Millisecond), float64(deleted)/elapsed.Seconds(), live)
}
