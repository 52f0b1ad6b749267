package pgxstore_test

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/internal/pgsql"
	"github.com/idemkit/idem/internal/sqlmeasure"
	"github.com/idemkit/idem/sqlstore/sqlstoretest"
)

// TestMeasureStatements (a measurement, -stores.measure; nothing
// asserted; the database must run on this machine, its backends' CPU is
// read from /proc): what the claim and the completion cost Postgres, in
// backend CPU per transaction (/proc/PID/schedstat of the connections'
// backends), next to the unprotected payment transaction and to
// variants of the claim. Eight connections run blocks of 250
// transactions per variant, the variants alternating over 7 rounds (the
// first one a warm-up); it logs the median CPU per transaction and its
// difference to the first variant. Variants (each pipelined as the store
// does: the claim with BEGIN, the completion with COMMIT):
//
//   - unprotected: BEGIN, the four payment statements, COMMIT;
//   - claim+update: the store's claim and completion, the completion moving
//     expires_at (the engine before it kept the claim's: a non-HOT update);
//   - claim+hot: the same, expires_at unchanged (today: a HOT update);
//   - lock+read+insert: one row write (the claim takes the advisory lock,
//     then reads in a statement of its own; the completion inserts the
//     record with ON CONFLICT);
//   - insert+hot: a bare INSERT as the claim (no lock, no ON CONFLICT: not
//     a correct claim, the floor of one that writes the row);
//   - returning+hot, donothing+hot: the bare INSERT with RETURNING of the
//     record, or with ON CONFLICT (id) DO NOTHING: what each part of the
//     claim adds;
//   - lockinsert+hot: the claim of an id never seen as the store sends it
//     (the INSERT alone with BEGIN), and lockinsert+readother+hot: the same
//     with the read that skips the row it wrote pipelined behind it (the
//     store before the claim's second step, issue 24);
//   - lockinsertread+hot: the INSERT with the read of the row it saw
//     folded in, gated on its output (a replay in one statement; not
//     used);
//   - lockinsertrow+hot: the INSERT in a CTE that also returns the lock's
//     result and the row (one statement for every path; not used).
//
// -stores.only REGEXP measures only the variants it matches (and the
// first).
func TestMeasureStatements(t *testing.T) {
	if !sqlmeasure.Measure() {
		t.Skip("a measurement: run with -stores.measure")
	}
	ctx := context.Background()
	s, pool, _ := newStore(t)
	p := newPayment(t, pool, s.Table())
	tb, q := s.Table(), pgsql.New(s.Table())
	type stmt struct {
		sql  string
		args func(r *stmtRun) []any
	}
	none := func(*stmtRun) []any { return nil }
	begin, commit := stmt{"BEGIN", none}, stmt{"COMMIT", none}
	claim := stmt{q.Claim, func(r *stmtRun) []any {
		return []any{r.lock, r.id, "acct_bench", "POST /settle", r.key, r.fp, r.lock, nil, r.exp, r.now, false}
	}}
	complete := `WITH u AS (` + q.Complete + ` RETURNING 1) SELECT 1 / count(*)::int FROM u`
	completeMoved := stmt{complete, func(r *stmtRun) []any {
		return []any{int16(2), 201, r.resp, r.exp.Add(3 * time.Millisecond), r.id, r.lock}
	}}
	completeHOT := stmt{complete, func(r *stmtRun) []any { return []any{int16(2), 201, r.resp, r.exp, r.id, r.lock} }}
	insertArgs := func(r *stmtRun) []any {
		return []any{r.id, "acct_bench", "POST /settle", r.key, r.fp, r.lock, r.exp, r.now}
	}
	bareInsert := stmt{`INSERT INTO ` + tb + ` (` + pgsql.Cols + `) VALUES ($1, $2, $3, $4, $5, 1, $6, 1, NULL, $7, $8, 0, NULL)`, insertArgs}
	returning := stmt{bareInsert.sql + ` RETURNING ` + pgsql.Cols, insertArgs}
	doNothing := stmt{bareInsert.sql + ` ON CONFLICT (id) DO NOTHING`, insertArgs}
	insertComplete := stmt{`WITH u AS (INSERT INTO ` + tb + ` AS r (` + pgsql.Cols + `) VALUES ($1, $2, $3, $4, $5, 2, $6, 1, NULL, $7, $8, 201, $9)
 ON CONFLICT (id) DO UPDATE SET caller = EXCLUDED.caller, scope = EXCLUDED.scope, idem_key = EXCLUDED.idem_key, fingerprint = EXCLUDED.fingerprint,
 state = EXCLUDED.state, token = EXCLUDED.token, attempt = 1, lease_until = NULL, expires_at = EXCLUDED.expires_at, created_at = EXCLUDED.created_at,
 status = EXCLUDED.status, response = EXCLUDED.response WHERE r.expires_at <= $8 RETURNING 1) SELECT 1 / count(*)::int FROM u`,
		func(r *stmtRun) []any { return append(insertArgs(r), r.resp) }}
	insertArgs10 := func(r *stmtRun) []any {
		return []any{r.lock, r.id, "acct_bench", "POST /settle", r.key, r.fp, r.lock, nil, r.exp, r.now}
	}
	lockInsert := stmt{q.Insert, insertArgs10}
	// The INSERT with the read folded in: the row it saw comes back in the
	// same statement when it inserts nothing (gated on its output, so a
	// first execution does not run the read). A replay would be one
	// statement; not used (BENCHMARKS.md, "A replay in one statement").
	lockInsertRead := stmt{`WITH c AS (
` + q.Insert + `
RETURNING id, token
)
SELECT EXISTS (SELECT FROM c), r.* FROM (SELECT) AS one
  LEFT JOIN (SELECT ` + pgsql.Cols + ` FROM ` + tb + ` WHERE id = $2 AND NOT EXISTS (SELECT FROM c)) AS r ON TRUE`, insertArgs10}
	lockInsertRow := stmt{`WITH lk AS MATERIALIZED (
    SELECT CASE WHEN EXISTS (SELECT FROM ` + tb + ` v WHERE v.id = $2) THEN NULL ELSE pg_try_advisory_xact_lock($1::bigint) END AS ok
), ins AS (
    INSERT INTO ` + tb + ` (id, caller, scope, idem_key, fingerprint, state, token, attempt, lease_until, expires_at, created_at, status)
    SELECT $2::bytea, $3::varchar, $4::varchar, $5::varchar, $6::bytea, 1::smallint, $7::bigint, 1, $8::timestamptz, $9::timestamptz, $10::timestamptz, 0
      FROM lk WHERE lk.ok
    ON CONFLICT (id) DO NOTHING
    RETURNING 1
)
SELECT lk.ok, EXISTS (SELECT FROM ins), r.* FROM lk LEFT JOIN ` + tb + ` r ON r.id = $2`, insertArgs10}
	lock := stmt{`SELECT pg_try_advisory_xact_lock($1)`, func(r *stmtRun) []any { return []any{r.lock} }}
	read := stmt{q.Read, func(r *stmtRun) []any { return []any{r.id} }}
	readOther := stmt{`SELECT ` + pgsql.Cols + ` FROM ` + tb + ` WHERE id = $1 AND token <> $2`, func(r *stmtRun) []any { return []any{r.id, r.lock} }}
	business := []([]stmt){
		{{"SELECT amount FROM " + p.orders + " WHERE id = $1 FOR UPDATE", func(r *stmtRun) []any { return []any{r.order} }}},
		{{"INSERT INTO " + p.payments + " (order_id, amount) VALUES ($1, $2)", func(r *stmtRun) []any { return []any{r.order, 1500} }}},
		{{"UPDATE " + p.orders + " SET paid = TRUE WHERE id = $1", func(r *stmtRun) []any { return []any{r.order} }}},
		{{"INSERT INTO " + p.outbox + " (topic, payload) VALUES ('payment', $1)", func(r *stmtRun) []any { return []any{strconv.Itoa(r.order)} }}},
	}
	tx := func(first, last []stmt) [][]stmt { return append(append([][]stmt{first}, business...), last) }
	type variant struct {
		name    string
		batches [][]stmt
	}
	variants := []variant{
		{"unprotected", tx([]stmt{begin}, []stmt{commit})},
		{"claim+update", tx([]stmt{begin, claim}, []stmt{completeMoved, commit})},
		{"claim+hot", tx([]stmt{begin, claim}, []stmt{completeHOT, commit})},
		{"lock+read+insert", tx([]stmt{begin, lock, read}, []stmt{insertComplete, commit})},
		{"insert+hot", tx([]stmt{begin, bareInsert}, []stmt{completeHOT, commit})},
		{"returning+hot", tx([]stmt{begin, returning}, []stmt{completeHOT, commit})},
		{"donothing+hot", tx([]stmt{begin, doNothing}, []stmt{completeHOT, commit})},
		{"lockinsert+hot", tx([]stmt{begin, lockInsert}, []stmt{completeHOT, commit})},
		{"lockinsertread+hot", tx([]stmt{begin, lockInsertRead}, []stmt{completeHOT, commit})},
		{"lockinsert+readother+hot", tx([]stmt{begin, lockInsert, readOther}, []stmt{completeHOT, commit})},
		{"lockinsertrow+hot", tx([]stmt{begin, lockInsertRow}, []stmt{completeHOT, commit})},
	}

	baseline := variants[0].name
	variants = slices.DeleteFunc(variants, func(v variant) bool { return v.name != baseline && !sqlmeasure.Only(v.name) })
	const workers, block, rounds = 8, 250, 7
	conns := make([]*pgx.Conn, workers)
	pids := make([]int, workers)
	for i := range conns {
		c, err := pgx.ConnectConfig(ctx, pool.Config().ConnConfig)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close(context.Background()) })
		if err := c.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pids[i]); err != nil {
			t.Fatal(err)
		}
		conns[i] = c
	}
	cpu := func() time.Duration {
		var sum int64
		for _, pid := range pids {
			b, err := os.ReadFile(fmt.Sprintf("/proc/%d/schedstat", pid))
			if err != nil {
				msg := fmt.Sprintf("the backends' CPU cannot be read (is the database on another machine?): %v", err)
				if sqlstoretest.Required() {
					t.Fatal(msg) // under CI a measurement that cannot be taken fails
				}
				t.Skip(msg)
			}
			ns, _ := strconv.ParseInt(strings.Fields(string(b))[0], 10, 64)
			sum += ns
		}
		return time.Duration(sum)
	}
	perTx := map[string][]float64{}
	for round := range rounds {
		for _, v := range variants {
			before := cpu()
			var wg sync.WaitGroup
			for w, c := range conns {
				wg.Go(func() {
					for i := range block {
						r := newStmtRun(w*block + i)
						for _, batch := range v.batches {
							b := &pgx.Batch{}
							for _, st := range batch {
								b.Queue(st.sql, st.args(r)...)
							}
							if err := c.SendBatch(ctx, b).Close(); err != nil {
								t.Errorf("%s: %v", v.name, err)
								return
							}
						}
					}
				})
			}
			wg.Wait()
			if round > 0 {
				perTx[v.name] = append(perTx[v.name], float64(cpu()-before)/float64(time.Microsecond)/(workers*block))
			}
		}
	}
	median := func(xs []float64) float64 { xs = slices.Clone(xs); slices.Sort(xs); return xs[len(xs)/2] }
	base := median(perTx[variants[0].name])
	for _, v := range variants {
		m := median(perTx[v.name])
		t.Logf("%-16s Postgres backend CPU per transaction: median %6.1f µs (%+6.1f µs; unprotected / this: %3.0f %%)", v.name, m, m-base, 100*base/m)
	}
}

// stmtRun is one transaction's parameters.
type stmtRun struct {
	id, fp, resp []byte
	key          string
	lock         int64
	order        int
	now, exp     time.Time
}

func newStmtRun(i int) *stmtRun {
	r := &stmtRun{id: make([]byte, 32), fp: make([]byte, 32), resp: make([]byte, 150), order: 1 + i%100}
	_, _ = rand.Read(r.id)
	_, _ = rand.Read(r.fp)
	r.lock = int64(binary.BigEndian.Uint64(r.id[:8]) >> 1)
	r.key = fmt.Sprint("bench-key-", r.lock)
	r.now = time.Now().UTC().Truncate(time.Microsecond)
	r.exp = r.now.Add(24 * time.Hour)
	return r
}
