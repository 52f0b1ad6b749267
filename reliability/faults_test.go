package reliability

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"log"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/store"
	"github.com/idemkit/idem/gormstore"
	"github.com/idemkit/idem/pgxstore"
	"github.com/idemkit/idem/sqlstore"
)

// TestDatabaseFaults hammers the HTTP middleware (core.Engine over
// sqlstore, in atomic and in leased mode, on PostgreSQL and MariaDB) while
// a TCP proxy between the store and the database adds latency and cuts
// connections: all at once, after a number of bytes (mid-statement,
// mid-transaction), just before a COMMIT reaches the server and just after
// (the commit happens; the client never hears of it). The handler writes
// one business row per execution. Afterwards, with the faults off:
//
//   - no key has more than one business row: no second execution;
//   - every 201 a client saw (first answer or replay) has its business row:
//     no false success;
//   - every answer is 201, 409, 500 or 503 (and 409/503 carry Retry-After):
//     a failure is never dressed up as anything else;
//   - every completed record's effect exists exactly once;
//   - atomic mode: no record is left in progress, and a retry of every key
//     now gets its 201 (the first one, or a fresh execution).
func TestDatabaseFaults(t *testing.T) {
	for _, d := range []sqlstore.Dialect{sqlstore.Postgres, sqlstore.MySQL} {
		for _, leased := range []bool{false, true} {
			mode := "atomic"
			if leased {
				mode = "leased"
			}
			t.Run("sqlstore/"+d.String()+"/"+mode, func(t *testing.T) { runFaults(t, d, leased, "sql") })
		}
		// gormstore runs sqlstore's SQL; its own part is the transaction
		// handling, which only atomic mode exercises.
		t.Run("gormstore/"+d.String()+"/atomic", func(t *testing.T) { runFaults(t, d, false, "gorm") })
	}
	// pgxstore: native pgx on Postgres, its claim pipelined with BEGIN and
	// its completion with COMMIT (the cut just before and after a COMMIT
	// now also cuts the completion).
	for _, leased := range []bool{false, true} {
		mode := "atomic"
		if leased {
			mode = "leased"
		}
		t.Run("pgxstore/postgres/"+mode, func(t *testing.T) { runFaults(t, sqlstore.Postgres, leased, "pgx") })
	}
}

// proxied opens a pool on d's test database through a new fault proxy,
// and a direct pool (admin) that no fault reaches.
func proxied(t *testing.T, d sqlstore.Dialect) (db, admin *sql.DB, p *faultProxy) {
	raw := dsn(t, d)
	admin = openDB(t, d, raw)
	switch d {
	case sqlstore.Postgres:
		cfg, err := pgx.ParseConfig(raw)
		if err != nil {
			t.Fatal(err)
		}
		p = newFaultProxy(t, net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port))))
		host, port, _ := net.SplitHostPort(p.Addr())
		u := strings.Replace(raw, net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port))), net.JoinHostPort(host, port), 1)
		if u == raw {
			t.Fatalf("cannot point the Postgres DSN at the proxy")
		}
		db = openDB(t, d, u)
		p.dsn = u
	case sqlstore.MySQL:
		cfg, err := mysql.ParseDSN(raw)
		if err != nil {
			t.Fatal(err)
		}
		p = newFaultProxy(t, cfg.Addr)
		cfg.Addr = p.Addr()
		cfg.Timeout, cfg.ReadTimeout, cfg.WriteTimeout = 5*time.Second, 10*time.Second, 10*time.Second
		db = openDB(t, d, cfg.FormatDSN())
	}
	db.SetMaxOpenConns(12)
	db.SetMaxIdleConns(12)
	return db, admin, p
}

type faultAnswer struct {
	key      string
	took     time.Duration
	status   int
	replayed bool
	body     string
	retry    string
}

func init() {
	// The MySQL driver logs every cut connection; the test counts them.
	_ = mysql.SetLogger(log.New(io.Discard, "", 0))
}

// faultStore is what runFaults needs of a store.
type faultStore interface {
	store.TxStore
	Table() string
}

func runFaults(t *testing.T, d sqlstore.Dialect, leased bool, kind string) {
	db, admin, proxy := proxied(t, d)
	var st faultStore
	switch kind {
	case "gorm":
		st = newGormStore(t, d, db)
	case "pgx":
		st = newPgxStore(t, proxy.dsn, admin)
	default:
		st = newSQLStore(t, d, db, admin)
	}
	biz := st.Table() + "_biz"
	ctx := context.Background()
	if _, err := admin.ExecContext(ctx, "CREATE TABLE "+biz+" (k VARCHAR(64) NOT NULL, attempt INT NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = admin.ExecContext(context.Background(), "DROP TABLE IF EXISTS "+biz) })
	ins := "INSERT INTO " + biz + " (k, attempt) VALUES (?, ?)"
	if d == sqlstore.Postgres {
		ins = "INSERT INTO " + biz + " (k, attempt) VALUES ($1, $2)"
	}

	var runs atomic.Int64
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		info, _ := core.AttemptFrom(r.Context())
		key := info.Identity.Key
		var err error
		if leased {
			core.MarkEffect(r.Context()) // the row is written outside the store's transaction
			_, err = db.ExecContext(r.Context(), ins, key, info.Attempt)
		} else if kind == "pgx" {
			tx, terr := pgxstore.Tx(r.Context())
			if terr != nil {
				t.Errorf("atomic mode without a transaction in the request context: %v", terr)
				w.WriteHeader(http.StatusInternalServerError)
				return
			}
			_, err = tx.Exec(r.Context(), ins, key, info.Attempt)
		} else if kind == "gorm" {
			gtx := gormstore.DB(r.Context())
			if gtx.Error != nil {
				t.Errorf("atomic mode without a GORM transaction in the request context: %v", gtx.Error)
				w.WriteHeader(http.StatusInternalServerError)
				return
			}
			err = gtx.Exec("INSERT INTO "+biz+" (k, attempt) VALUES (?, ?)", key, info.Attempt).Error
		} else {
			tx, terr := sqlstore.Tx(r.Context())
			if terr != nil {
				t.Errorf("atomic mode without a transaction in the request context: %v", terr)
				w.WriteHeader(http.StatusInternalServerError)
				return
			}
			_, err = tx.ExecContext(r.Context(), ins, key, info.Attempt)
		}
		if err != nil {
			http.Error(w, "business write failed", http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"order":%q}`, key)
	})
	e, err := core.New(st, core.WithSingleCaller(), core.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
	if err != nil {
		t.Fatal(err)
	}
	opts := []core.RouteOption{core.Scope("POST /orders")}
	if leased {
		opts = append(opts, core.Leased())
	}
	h := e.Handler(handler, opts...)
	send := faultSender(h)
	seed, run := faultSeed(t)
	answers, faults := hammer(send, seed, run, func(rng *rand.Rand) string {
		switch rng.IntN(6) {
		case 0:
			proxy.cutAll()
			return "cut all connections"
		case 1:
			proxy.cutBytes.Store(1 + rng.Int64N(4000))
			return "cut one connection after N bytes"
		case 2:
			proxy.cutCommit.Store(1)
			return "cut before COMMIT"
		case 3:
			proxy.cutCommit.Store(2)
			return "cut after COMMIT"
		case 4:
			proxy.maxLatency.Store(int64(time.Duration(rng.IntN(5000)) * time.Microsecond))
			return "latency"
		}
		proxy.maxLatency.Store(0)
		return ""
	})
	proxy.maxLatency.Store(0)
	proxy.cutBytes.Store(0)
	proxy.cutCommit.Store(0)

	statuses := map[int]int{}
	for _, a := range answers {
		statuses[a.status]++
	}
	t.Logf("%d requests, %d handler runs, statuses %v; faults %v; connections cut %d, at COMMIT %d (of %d COMMITs)",
		len(answers), runs.Load(), statuses, faults, proxy.cuts.Load(), proxy.commitCuts.Load(), proxy.commits.Load())
	slowest := slices.MaxFunc(answers, func(a, b faultAnswer) int { return int(a.took - b.took) })
	t.Logf("slowest answer: %v, %d %s", slowest.took, slowest.status, strings.TrimSpace(slowest.body))
	if len(answers) < 20 || statuses[http.StatusCreated] == 0 {
		t.Fatalf("the hammer did not get through (%d requests, statuses %v): the test proves nothing", len(answers), statuses)
	}

	// With the faults off: in atomic mode nothing may stay in progress
	// (the database rolled back every cut transaction).
	if !leased {
		deadline := time.Now().Add(15 * time.Second)
		for {
			var n int
			if err := admin.QueryRowContext(ctx, "SELECT COUNT(*) FROM "+st.Table()+" WHERE state = 1").Scan(&n); err != nil {
				t.Fatal(err)
			}
			if n == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("atomic mode: %d records still in progress 15 s after the faults stopped", n)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}

	// A retry of every key, without faults.
	sent, retries := retryAll(answers, send)
	for _, a := range retries {
		if !leased && a.status != http.StatusCreated {
			t.Errorf("atomic mode, after the faults: %s got %d %s, want 201 (replayed or executed now; seed %d)", a.key, a.status, a.body, seed)
		}
	}
	answers = append(answers, retries...)

	// Business rows per key, and the attempts that wrote them.
	type bizRows struct{ n, attempts, maxAttempt int }
	rows := map[string]bizRows{}
	q, err := admin.QueryContext(ctx, "SELECT k, COUNT(*), COUNT(DISTINCT attempt), MAX(attempt) FROM "+biz+" GROUP BY k")
	if err != nil {
		t.Fatal(err)
	}
	for q.Next() {
		var k string
		var b bizRows
		if err := q.Scan(&k, &b.n, &b.attempts, &b.maxAttempt); err != nil {
			t.Fatal(err)
		}
		rows[k] = b
	}
	if err := q.Close(); err != nil {
		t.Fatal(err)
	}
	takeovers := 0
	for k, b := range rows {
		switch {
		case !leased && b.n > 1:
			t.Errorf("SECOND EXECUTION: %s has %d business rows (seed %d)", k, b.n, seed)
		case leased && b.n > b.attempts:
			t.Errorf("SECOND EXECUTION: %s has %d business rows written by %d distinct attempts (seed %d)", k, b.n, b.attempts, seed)
		case leased && b.n > 1:
			// Leased mode: an attempt whose outcome could not be recorded
			// (its Complete was cut) keeps its lease until it lapses
			// (30 s); then a retry takes over with the next attempt
			// number and runs again, by design (docs/contract.md, section 5 "Atomic and leased modes"; real
			// handlers pass DownstreamKey to the external service).
			takeovers += b.n - 1
		}
	}
	for _, a := range answers {
		switch a.status {
		case http.StatusCreated:
			if a.body != fmt.Sprintf(`{"order":%q}`, a.key) {
				t.Errorf("%s: 201 with body %q", a.key, a.body)
			}
			if rows[a.key].n == 0 {
				t.Errorf("FALSE SUCCESS: %s got 201 (replayed=%v) but has no business row (seed %d)", a.key, a.replayed, seed)
			}
		case http.StatusConflict, http.StatusServiceUnavailable:
			if a.retry == "" {
				t.Errorf("%s: %d without Retry-After: %s", a.key, a.status, a.body)
			}
		case http.StatusInternalServerError:
		default:
			t.Errorf("%s: unexpected answer %d %s", a.key, a.status, a.body)
		}
	}

	// Every record's effect: exactly once if completed, at most once otherwise.
	byState := map[store.State]int{}
	for key := range sent {
		id := store.Identity{Scope: "POST /orders", Key: key}.ID()
		rec, err := st.Get(ctx, id, time.Now())
		if err != nil {
			if rows[key].n != 0 && !leased {
				t.Errorf("%s has no record but %d business rows", key, rows[key].n)
			}
			continue
		}
		byState[rec.State]++
		if rec.State == store.StateCompleted && rec.Status == http.StatusCreated && (rows[key].n == 0 || (!leased && rows[key].n != 1)) {
			t.Errorf("%s: completed 201 record, %d business rows", key, rows[key].n)
		}
		if rows[key].maxAttempt > rec.Attempt {
			t.Errorf("%s: a business row of attempt %d, but the record is at attempt %d", key, rows[key].maxAttempt, rec.Attempt)
		}
		if !leased && rec.State != store.StateCompleted {
			t.Errorf("atomic mode: %s ends %v", key, rec.State)
		}
	}
	t.Logf("records at the end: %v; leased takeovers that ran again after a lapsed lease: %d", byState, takeovers)
}

// faultSender returns a client of h: it POSTs an order with key to
// /orders and returns the answer.
func faultSender(h http.Handler) func(key string) faultAnswer {
	return func(key string) faultAnswer {
		rctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		r := httptest.NewRequestWithContext(rctx, "POST", "/orders", strings.NewReader(`{"order":"`+key+`"}`))
		r.Header.Set("Content-Type", "application/json")
		r.Header.Set(core.HeaderKey, key)
		w := httptest.NewRecorder()
		start := time.Now()
		h.ServeHTTP(w, r)
		return faultAnswer{key: key, took: time.Since(start), status: w.Code, replayed: w.Header().Get(core.HeaderReplayed) == "true",
			body: w.Body.String(), retry: w.Header().Get("Retry-After")}
	}
}

// faultSeed returns the seed of t's schedules (-reliability.seed, or a new
// one) and how long to hammer, and logs both.
func faultSeed(t *testing.T) (uint64, time.Duration) {
	t.Helper()
	seed := *seedFlag
	if seed == 0 {
		seed = rand.Uint64()
	}
	run := 4 * time.Second
	if *long {
		run = *duration
	}
	t.Logf("seed %d, hammering for %v (rerun with -run '^%s$' -reliability.seed=%d)", seed, run, t.Name(), seed)
	return seed, run
}

// hammer sends requests through send from 8 workers for run (half of
// them reuse a few hot keys: duplicates, often concurrent; half use fresh
// keys: first executions all along) while inject, every 20-140 ms,
// injects a fault and names it ("" for none). It returns every answer and
// how often each fault was injected.
func hammer(send func(key string) faultAnswer, seed uint64, run time.Duration, inject func(rng *rand.Rand) string) ([]faultAnswer, map[string]int) {
	const hot, workers = 20, 8
	stop := time.Now().Add(run)
	var (
		mu      sync.Mutex
		answers []faultAnswer
		wg      sync.WaitGroup
	)
	for w := range workers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(seed, uint64(w)))
			for i := 0; time.Now().Before(stop); i++ {
				key := fmt.Sprintf("hot-%d", rng.IntN(hot))
				if rng.IntN(2) == 0 {
					key = fmt.Sprintf("order-%d-%d", w, i)
				}
				a := send(key)
				mu.Lock()
				answers = append(answers, a)
				mu.Unlock()
			}
		})
	}
	faults := map[string]int{}
	wg.Go(func() {
		rng := rand.New(rand.NewPCG(seed, 1<<20))
		for time.Now().Before(stop) {
			time.Sleep(time.Duration(20+rng.IntN(120)) * time.Millisecond)
			if name := inject(rng); name != "" {
				faults[name]++
			}
		}
	})
	wg.Wait()
	return answers, faults
}

// retryAll sends every key of answers once more, with the faults off,
// retrying a 503 up to three times (a connection cut just before the
// faults stopped may still sit in the pool; a client retries a 503). It
// returns the keys and the answers.
func retryAll(answers []faultAnswer, send func(key string) faultAnswer) (map[string]bool, []faultAnswer) {
	sent := map[string]bool{}
	for _, a := range answers {
		sent[a.key] = true
	}
	var out []faultAnswer
	for key := range sent {
		a := send(key)
		for try := 0; a.status == http.StatusServiceUnavailable && try < 3; try++ {
			time.Sleep(100 * time.Millisecond)
			a = send(key)
		}
		out = append(out, a)
	}
	return sent, out
}
