package dbtest_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/store"
	"github.com/idemkit/idem/core/storetest"
	"github.com/idemkit/idem/internal/sqlmeasure"
	"github.com/idemkit/idem/sqlstore"
	"github.com/idemkit/idem/sqlstore/sqlstoretest"
)

// galeraLayout says where galeraFixtures opens its pools.
type galeraLayout struct {
	oneNode  bool // every pool on the first node (replicas on one node)
	syncWait bool // wsrep_sync_wait=1 in the DSN (the README's advice)
}

// openGalera opens a pool on each node of the Galera cluster the
// environment names (IDEM_TEST_GALERA_DSNS), closed at cleanup.
func openGalera(t testing.TB, l galeraLayout) []*sql.DB {
	t.Helper()
	var dbs []*sql.DB
	dsns := sqlstoretest.DSNs(t, sqlstoretest.EnvGalera, 2)
	for _, dsn := range dsns {
		if l.oneNode {
			dsn = dsns[0]
		}
		cfg, err := mysql.ParseDSN(dsn)
		if err != nil {
			t.Fatalf("%s: %v", sqlstoretest.EnvGalera, err)
		}
		if l.syncWait {
			if cfg.Params == nil {
				cfg.Params = map[string]string{}
			}
			cfg.Params["wsrep_sync_wait"] = "1"
		}

		conn, err := mysql.NewConnector(cfg)
		if err != nil {
			t.Fatal(err)
		}
		db := sql.OpenDB(conn)
		db.SetMaxIdleConns(40)
		t.Cleanup(func() { db.Close() })
		if err := db.PingContext(context.Background()); err != nil {
			t.Fatalf("galera node %s: %v", cfg.Addr, err)
		}
		dbs = append(dbs, db)
	}
	return dbs
}

// galeraFixtures returns one fixture per Galera node, all on one fresh
// table (and business table), created on the first node.
func galeraFixtures(t *testing.T, l galeraLayout, opts ...sqlstore.Option) []sqlstoretest.Fixture {
	t.Helper()
	dbs := openGalera(t, l)
	table := sqlstoretest.Table()
	orders := table + "_orders"
	ctx := context.Background()
	s0, err := sqlstore.New(dbs[0], sqlstore.MySQL, append([]sqlstore.Option{sqlstore.WithTable(table)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	if err := s0.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	// Galera replicates only InnoDB tables with a primary key.
	if _, err := dbs[0].ExecContext(ctx, "CREATE TABLE "+orders+" (id BIGINT AUTO_INCREMENT PRIMARY KEY, name VARCHAR(100) NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, tb := range []string{table, table + "_marks", orders} {
			if _, err := dbs[0].ExecContext(context.Background(), "DROP TABLE IF EXISTS "+tb); err != nil {
				t.Errorf("drop %s: %v", tb, err)
			}
		}
	})
	// Every node has the tables before its store is used: a node may
	// still be applying the CREATE TABLEs when the first statement of a
	// peer's store arrives (an UPDATE, which wsrep_sync_wait=1 does not
	// make wait, failed with 1146 "doesn't exist" in storetest's
	// SettleVisit, 2 runs in 40). A causal read of each table waits until
	// the node has applied them.
	for _, db := range dbs[1:] {
		for _, tb := range []string{table, table + "_marks", orders} {
			var n int
			if err := db.QueryRowContext(ctx, "SET STATEMENT wsrep_sync_wait = 1 FOR SELECT COUNT(*) FROM "+tb).Scan(&n); err != nil {
				t.Fatalf("table %s on a peer node: %v", tb, err)
			}
		}
	}
	fs := make([]sqlstoretest.Fixture, len(dbs))
	for i, db := range dbs {
		s := s0
		if i > 0 {
			if s, err = sqlstore.New(db, sqlstore.MySQL, append([]sqlstore.Option{sqlstore.WithTable(table)}, opts...)...); err != nil {
				t.Fatal(err)
			}
		}
		fs[i] = sqlstoretest.Fixture{
			Store: s,
			Insert: func(ctx context.Context, name string) error {
				tx, err := sqlstore.Tx(ctx) // the handler's accessor
				if err != nil {
					return err
				}
				_, err = tx.ExecContext(ctx, "INSERT INTO "+orders+" (name) VALUES (?)", name)
				return err
			},
			Count: func(t testing.TB, name string) int {
				var n int
				// Wait until this node has applied what the others committed.
				if err := db.QueryRowContext(context.Background(), "SET STATEMENT wsrep_sync_wait = 1 FOR SELECT COUNT(*) FROM "+orders+" WHERE name = ?", name).Scan(&n); err != nil {
					t.Fatal(err)
				}
				return n
			},
			CallerManaged: func(ctx context.Context, fn func(ctx context.Context) error) error {
				tx, err := db.BeginTx(ctx, nil)
				if err != nil {
					return err
				}
				if err := fn(sqlstore.WithTx(ctx, tx)); err != nil {
					_ = tx.Rollback()
					return err
				}
				return tx.Commit()
			},
			DB: db,
		}
	}
	return fs
}

// TestGaleraExactlyOnce: one key's concurrent requests spread over the
// nodes of a Galera cluster, in atomic and leased mode: one execution,
// every other answer its replay or 409, never 503. The stores read with
// wsrep_sync_wait=1, as the README advises: the sequential requests after
// the storm must replay on every node, and without it a node may not have
// applied the completion yet (it then answers 409: safe, not a replay).
func TestGaleraExactlyOnce(t *testing.T) {
	sqlstoretest.RunExactlyOnceAcross(t, sqlstoretest.ClusterConfig{Dialect: sqlstore.MySQL, New: func(t *testing.T) []sqlstoretest.Fixture {
		return galeraFixtures(t, galeraLayout{syncWait: true})
	}})
}

// TestGaleraStormMeasure (with -stores.measure) measures storms of one
// key's duplicates with three replicas on one Galera node and spread over
// three (BENCHMARKS.md): throughput, and the share of first executions
// that lost certification and were rolled back.
func TestGaleraStormMeasure(t *testing.T) {
	if !sqlmeasure.Measure() {
		t.Skip("a measurement: run with -stores.measure")
	}
	const (
		workers = 4
		dup     = 6
		d       = 5 * time.Second
	)
	for _, leased := range []bool{false, true} {
		mode := map[bool]string{false: "atomic", true: "leased"}[leased]
		for _, l := range []struct {
			name string
			l    galeraLayout
		}{
			{"one-node", galeraLayout{oneNode: true}},
			{"three-nodes", galeraLayout{}},
			{"three-nodes-sync-wait", galeraLayout{syncWait: true}},
		} {
			t.Run(mode+"/"+l.name, func(t *testing.T) {
				st := measureStorms(t, galeraFixtures(t, l.l), leased, workers, dup, d)
				t.Logf("MEASURE %s %s: %d storms of %d in %v: %.0f storms/s, %.0f requests/s; %d handler runs, %d lost certification (%.1f %% of first executions); %d unexpected answers",
					mode, l.name, st.Storms, dup, st.Elapsed.Round(time.Millisecond), float64(st.Storms)/st.Elapsed.Seconds(),
					float64(st.Requests)/st.Elapsed.Seconds(), st.Runs, st.Lost, 100*float64(st.Lost)/float64(max(st.Runs, 1)), st.Unexpected)
			})
		}
	}
}

// stormStats is what measureStorms counts.
type stormStats struct {
	Storms, Requests int64 // storms (one key each) and requests answered
	Runs             int64 // handler executions (atomic mode: committed or rolled back)
	Lost             int64 // executions beyond the one per key: rolled back (lost certification)
	Unexpected       int64 // answers other than 201 or 409 (503 included)
	Elapsed          time.Duration
}

// measureStorms runs, for d, workers goroutines that each send storms of
// dup identical requests (a new key per storm), request i of a storm to
// a service on fs[i mod len(fs)], in atomic mode (the handler inserts a
// business row) or leased mode (its effect is the count of runs alone). It
// is a measurement, not a test: it fails only on an unexpected answer.
func measureStorms(t *testing.T, fs []sqlstoretest.Fixture, leased bool, workers, dup int, d time.Duration) stormStats {
	t.Helper()
	var runs atomic.Int64
	var opts []core.RouteOption
	if leased {
		opts = append(opts, core.Leased())
	}
	quiet := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	urls := make([]string, len(fs))
	for i, f := range fs {
		e, err := core.New(f.Store, core.WithSingleCaller(), core.WithLogger(quiet))
		if err != nil {
			t.Fatal(err)
		}
		srv := httptest.NewServer(e.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			runs.Add(1)
			if leased {
				core.MarkEffect(r.Context())
			} else if err := f.Insert(r.Context(), r.Header.Get(core.HeaderKey)); err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			w.WriteHeader(http.StatusCreated)
		}), opts...))
		t.Cleanup(srv.Close)
		urls[i] = srv.URL
	}
	client := &http.Client{Transport: &http.Transport{MaxIdleConns: 256, MaxIdleConnsPerHost: 256}, Timeout: 30 * time.Second}
	t.Cleanup(client.CloseIdleConnections)
	var storms, requests, unexpected atomic.Int64
	start := time.Now()
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for n := 0; time.Since(start) < d; n++ {
				key := fmt.Sprintf("measure-%d-%d-%s", w, n, sqlstoretest.Table())
				var sw sync.WaitGroup
				for i := range dup {
					sw.Go(func() {
						status, err := postKey(client, urls[(i+w)%len(urls)], key)
						requests.Add(1)
						if err != nil || (status != http.StatusCreated && status != http.StatusConflict) {
							if unexpected.Add(1) == 1 {
								t.Errorf("unexpected answer: %d %v", status, err)
							}
						}
					})
				}
				sw.Wait()
				storms.Add(1)
			}
		})
	}
	wg.Wait()
	st := stormStats{Elapsed: time.Since(start), Storms: storms.Load(), Requests: requests.Load(), Runs: runs.Load(), Unexpected: unexpected.Load()}
	st.Lost = st.Runs - st.Storms
	return st
}

// postKey sends POST with the Idempotency-Key key and returns the status.
func postKey(c *http.Client, url, key string) (int, error) {
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(`{"item":"x"}`))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(core.HeaderKey, key)
	resp, err := c.Do(req)
	if err != nil {
		return 0, err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, nil
}

// TestGaleraConformance runs core/storetest on a Galera cluster: every
// case on a store on the first node, and the race cases with their racers
// spread over the three nodes (storetest.Peers), each node's store reading
// with wsrep_sync_wait=1 as the README advises.
func TestGaleraConformance(t *testing.T) {
	var (
		mu    sync.Mutex
		peers = map[store.Store][]store.Store{}
	)
	storetest.Run(t, func(t *testing.T) store.Store {
		fs := galeraFixtures(t, galeraLayout{syncWait: true})
		var others []store.Store
		for _, f := range fs[1:] {
			others = append(others, f.Store)
		}
		mu.Lock()
		defer mu.Unlock()
		peers[fs[0].Store] = others
		return fs[0].Store
	}, storetest.Peers(func(t *testing.T, s store.Store) []store.Store {
		mu.Lock()
		defer mu.Unlock()
		return peers[s]
	}))
}

// TestGaleraOnceCallerManaged: two consumers on two Galera nodes run
// Engine.Once for one message, each in its own transaction (caller-managed,
// sqlstore.WithTx). Both claim (neither node sees the other's uncommitted
// claim); the first commits, and the second, whose transaction the first's
// replicated write aborted, gets an error matching core.ErrInProgress (so
// it can nack and retry), never ErrStoreUnavailable; its retry gets the
// first's value.
func TestGaleraOnceCallerManaged(t *testing.T) {
	fs := galeraFixtures(t, galeraLayout{syncWait: true})
	ctx := t.Context()
	engines := make([]*core.Engine, 2)
	for i := range engines {
		e, err := core.New(fs[i].Store, core.WithSingleCaller())
		if err != nil {
			t.Fatal(err)
		}
		engines[i] = e
	}
	msg := core.Message{Consumer: "ledger", ID: "msg-" + sqlstoretest.Table()}
	loserClaimed, winnerCommitted, loserDone := make(chan struct{}), make(chan struct{}), make(chan struct{})
	commit := sync.OnceFunc(func() { close(winnerCommitted) })
	t.Cleanup(commit) // after the fixtures': a test that ends early frees the loser, whose open transaction the DROP would wait for
	var loserErr error
	var wg sync.WaitGroup
	wg.Go(func() {
		defer close(loserDone)
		loserErr = fs[1].CallerManaged(ctx, func(ctx context.Context) error {
			_, err := engines[1].Once(ctx, msg, func(ctx context.Context) ([]byte, error) {
				if err := fs[1].Insert(ctx, msg.ID); err != nil {
					return nil, err
				}
				close(loserClaimed)
				<-winnerCommitted
				return []byte("loser"), nil
			})
			return err
		})
	})
	select {
	case <-loserClaimed:
	case <-loserDone:
		t.Fatalf("the loser ended before its insert ran: %v", loserErr)
	case <-time.After(failsafe):
		t.Fatalf("the loser did not claim and insert within %v", failsafe)
	}
	err := fs[0].CallerManaged(ctx, func(ctx context.Context) error {
		res, err := engines[0].Once(ctx, msg, func(ctx context.Context) ([]byte, error) {
			return []byte("winner"), fs[0].Insert(ctx, msg.ID)
		})
		if err == nil && (res.Replayed || string(res.Value) != "winner") {
			err = fmt.Errorf("first run: %+v", res)
		}
		return err
	})
	commit()
	wg.Wait()
	if err != nil {
		t.Fatalf("winner: %v", err)
	}
	// The winner's replicated write aborts the loser's transaction either
	// under Once's own statement (the engine answers ErrInProgress) or at
	// the application's own COMMIT, after Once returned: the application
	// then gets the driver's deadlock error (1213, retry) from its commit,
	// which the engine never saw. Either way nothing of the loser is kept.
	var myErr *mysql.MySQLError
	atCommit := errors.As(loserErr, &myErr) && myErr.Number == 1213
	if !atCommit && (!errors.Is(loserErr, core.ErrInProgress) || errors.Is(loserErr, core.ErrStoreUnavailable)) {
		t.Fatalf("loser: %v, want an error matching core.ErrInProgress (or its own COMMIT's 1213)", loserErr)
	}
	if n := fs[0].Count(t, msg.ID); n != 1 {
		t.Errorf("business rows: %d, want 1", n)
	}
	var res core.Result
	err = fs[1].CallerManaged(ctx, func(ctx context.Context) error {
		var err error
		res, err = engines[1].Once(ctx, msg, func(ctx context.Context) ([]byte, error) {
			return nil, errors.New("ran again")
		})
		return err
	})
	if err != nil || !res.Replayed || string(res.Value) != "winner" {
		t.Fatalf("the loser's retry: %+v, %v, want the winner's value replayed", res, err)
	}
}

// TestGaleraCheckSyncWait: with WithRequireSyncWait, Check on a Galera node
// fails with core.ErrConfig naming the DSN parameter when the connection
// reads without wsrep_sync_wait, and passes with wsrep_sync_wait=1; on a
// server without Galera (the single MariaDB) the option asks nothing, and
// without the option Check passes on Galera either way.
func TestGaleraCheckSyncWait(t *testing.T) {
	ctx := context.Background()
	check := func(t *testing.T, db *sql.DB, opts ...sqlstore.Option) error {
		t.Helper()
		s, err := sqlstore.New(db, sqlstore.MySQL, append([]sqlstore.Option{sqlstore.WithTable(sqlstoretest.Table())}, opts...)...)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
		return s.Check(ctx)
	}
	without := openGalera(t, galeraLayout{oneNode: true})[0]
	with := openGalera(t, galeraLayout{oneNode: true, syncWait: true})[0]
	wantConfigError(t, "Check without wsrep_sync_wait", check(t, without, sqlstore.WithRequireSyncWait()),
		"wsrep_sync_wait", "wsrep_sync_wait=1")
	if err := check(t, with, sqlstore.WithRequireSyncWait()); err != nil {
		t.Fatalf("Check with wsrep_sync_wait=1: %v", err)
	}
	if err := check(t, without); err != nil {
		t.Fatalf("Check without the option: %v", err)
	}
	single, _ := openDB(t, sqlstore.MySQL)
	if err := check(t, single, sqlstore.WithRequireSyncWait()); err != nil {
		t.Fatalf("Check on a server without Galera: %v", err)
	}
}

// TestGaleraCompleter: the completer's race with the replicas on two
// Galera nodes (sqlstoretest.RunCompleter): one settler across the
// cluster, one payment row.
func TestGaleraCompleter(t *testing.T) {
	sqlstoretest.RunCompleter(t, sqlstoretest.ClusterConfig{Dialect: sqlstore.MySQL, New: func(t *testing.T) []sqlstoretest.Fixture {
		return galeraFixtures(t, galeraLayout{syncWait: true})
	}})
}

// TestGaleraFinisher: the finisher's race with the replicas on two Galera
// nodes (sqlstoretest.RunFinisher): one charge across the cluster.
//
// Leased routes only: in atomic mode across nodes of a multi-primary
// cluster, a claim is seen by the other node only when it commits, so a
// finisher and a client's retry on another node can both run before
// certification settles which one's transaction stays, and an external
// effect of the loser is not undone (docs/decisions.md: atomic mode on
// Galera wants one router, or Leased for routes with provider calls).
// The completer refuses that configuration
// (TestGaleraFinisherAtomicRefused).
func TestGaleraFinisher(t *testing.T) {
	sqlstoretest.RunFinisherLeased(t, sqlstoretest.ClusterConfig{Dialect: sqlstore.MySQL, New: func(t *testing.T) []sqlstoretest.Fixture {
		return galeraFixtures(t, galeraLayout{syncWait: true})
	}})
}

// TestGaleraFinisherAtomicRefused: a store on a Galera node says it is
// on a multi-primary cluster (store.MultiPrimary, @@wsrep_on), and a
// completer over it refuses to run an atomic route's finisher, at Start
// and at every pass, with an error wrapping core.ErrConfig that names
// the fixes (core.Leased, or one writer node: sqlstore.WithOneWriterNode);
// with that option, and on the single MariaDB, the store is not
// multi-primary and the completer starts.
func TestGaleraFinisherAtomicRefused(t *testing.T) {
	ctx := context.Background()
	start := func(t *testing.T, s store.TxStore) error {
		t.Helper()
		e, err := core.New(s, core.WithSingleCaller())
		if err != nil {
			t.Fatal(err)
		}
		e.Route(core.Name("payments"), core.RecordRequest(nil),
			core.WithResolver(func(context.Context, store.Record) (core.Resolution, error) { return core.Resolution{}, nil }),
			core.Finish(func(context.Context, core.RecordedRequest) *core.Response { return &core.Response{Status: 201} }))
		c := e.Completer()
		c.Every = time.Hour
		err = c.Start(ctx)
		c.Stop()
		if _, perr := c.Complete(ctx); (perr == nil) != (err == nil) {
			t.Errorf("Start: %v, but a pass: %v; want the same answer", err, perr)
		}
		return err
	}
	multi := func(t *testing.T, s store.TxStore) bool {
		t.Helper()
		mp, ok := s.(store.MultiPrimary)
		if !ok {
			t.Fatalf("%T does not implement store.MultiPrimary", s)
		}
		m, err := mp.MultiPrimary(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	galera := galeraFixtures(t, galeraLayout{syncWait: true})[0].Store
	if !multi(t, galera) {
		t.Fatal("a store on a Galera node: MultiPrimary false, want true")
	}
	wantConfigError(t, "Start with an atomic finisher on Galera", start(t, galera), "multi-primary", "core.Leased", "sqlstore.WithOneWriterNode")
	one := galeraFixtures(t, galeraLayout{oneNode: true, syncWait: true}, sqlstore.WithOneWriterNode())[0].Store
	if multi(t, one) {
		t.Error("a store told WithOneWriterNode: MultiPrimary true, want false")
	}
	if err := start(t, one); err != nil {
		t.Errorf("Start with one writer node: %v", err)
	}
	single := fixture(t, sqlstore.MySQL).Store
	if multi(t, single) {
		t.Error("a store on the single MariaDB: MultiPrimary true, want false")
	}
	if err := start(t, single); err != nil {
		t.Errorf("Start on the single MariaDB: %v", err)
	}
}

// TestGaleraFinisherOneWriterNode: an atomic finisher on Galera with
// every replica writing through one node, as the store is told
// (sqlstore.WithOneWriterNode): one charge (sqlstoretest.RunFinisher,
// atomic).
func TestGaleraFinisherOneWriterNode(t *testing.T) {
	sqlstoretest.RunFinisherAtomic(t, sqlstoretest.ClusterConfig{Dialect: sqlstore.MySQL, New: func(t *testing.T) []sqlstoretest.Fixture {
		return galeraFixtures(t, galeraLayout{oneNode: true, syncWait: true}, sqlstore.WithOneWriterNode())
	}})
}
