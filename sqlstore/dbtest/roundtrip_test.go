package dbtest_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/sqlstore"
	"github.com/idemkit/idem/sqlstore/sqlstoretest"
)

// TestRoundTrips logs the statements one HTTP request sends to the
// database through the engine, per dialect and mode: a first execution, a
// replay and an in-flight duplicate rejected with 409 (BEGIN and
// COMMIT/ROLLBACK are not counted; the driver's prepares are given apart).
// The handler itself sends nothing. An in-flight duplicate is counted
// from the same store (its registry of in-flight ids answers) and from a
// second store on the same table, as another process would be. It checks only that each request got
// its answer; the counts are for BENCHMARKS.md (go test -v -run
// TestRoundTrips).
func TestRoundTrips(t *testing.T) {
	for _, d := range dialects {
		for _, leased := range []bool{false, true} {
			mode := "atomic"
			if leased {
				mode = "leased"
			}
			t.Run(d.String()+"/"+mode, func(t *testing.T) {
				// Two stores on one table, each with its own pool, as two
				// processes would have.
				db, counter, path := openDBAt(t, d, "")
				db2, counter2, _ := openDBAt(t, d, path)
				table := sqlstoretest.Table()
				st, err := sqlstore.New(db, d, sqlstore.WithTable(table))
				if err != nil {
					t.Fatal(err)
				}
				st2, err := sqlstore.New(db2, d, sqlstore.WithTable(table))
				if err != nil {
					t.Fatal(err)
				}
				if err := st.Migrate(context.Background()); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _, _ = db.ExecContext(context.Background(), "DROP TABLE IF EXISTS "+table) })
				quiet := core.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil)))
				e, err := core.New(st, core.WithSingleCaller(), quiet)
				if err != nil {
					t.Fatal(err)
				}
				e2, err := core.New(st2, core.WithSingleCaller(), quiet)
				if err != nil {
					t.Fatal(err)
				}
				opts := []core.RouteOption{core.Scope("POST /orders")}
				if leased {
					opts = append(opts, core.Leased())
				}
				hold, held := make(chan struct{}), make(chan struct{}, 1) // held: a late handler never blocks on it
				// After the stores' cleanups, so it runs first: a test that
				// ends early frees the held handler, whose open transaction
				// (atomic mode) the DROP would wait for.
				t.Cleanup(sync.OnceFunc(func() { close(hold) }))
				handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					if r.Header.Get("X-Hold") != "" {
						held <- struct{}{}
						<-hold
					}
					w.WriteHeader(http.StatusCreated)
					_, _ = io.WriteString(w, `{"id":1}`)
				})
				h, h2 := e.Handler(handler, opts...), e2.Handler(handler, opts...)
				var sendTo func(h http.Handler, counter *sqlstoretest.Counter, key string, hdr ...string) (int, int64, int64)
				send := func(key string, hdr ...string) (int, int64, int64) {
					return sendTo(h, counter, key, hdr...)
				}
				sendTo = func(h http.Handler, counter *sqlstoretest.Counter, key string, hdr ...string) (int, int64, int64) {
					r := httptest.NewRequest("POST", "/orders", strings.NewReader(`{"item":"coffee"}`))
					r.Header.Set("Content-Type", "application/json")
					r.Header.Set(core.HeaderKey, key)
					if len(hdr) > 0 {
						r.Header.Set("X-Hold", "1")
					}
					s0, p0 := counter.Statements(), counter.Prepares()
					w := httptest.NewRecorder()
					h.ServeHTTP(w, r)
					return w.Code, counter.Statements() - s0, counter.Prepares() - p0
				}
				code, first, firstP := send("k1")
				if code != http.StatusCreated {
					t.Fatalf("first: %d", code)
				}
				code, replay, replayP := send("k1")
				if code != http.StatusCreated {
					t.Fatalf("replay: %d", code)
				}
				// In-flight duplicates: from the same store (the registry of
				// in-flight ids answers) and from the other one (the database's
				// lock probe answers; SQLite waits for the writer instead).
				dup := func(h http.Handler, counter *sqlstoretest.Counter, key string) string {
					if d == sqlstore.SQLite && !leased && counter == counter2 {
						return "waits for the first transaction (one writer at a time), then replays"
					}
					done := make(chan struct{})
					var heldCode int
					go func() { defer close(done); heldCode, _, _ = send(key, "hold") }()
					select {
					case <-held:
					case <-done:
						t.Fatalf("the held first request of %s answered %d before its handler ran", key, heldCode)
					case <-time.After(failsafe):
						t.Fatalf("the held first request of %s: its handler did not start within %v", key, failsafe)
					}
					code, n, p := sendTo(h, counter, key)
					hold <- struct{}{}
					<-done
					if code != http.StatusConflict {
						t.Fatalf("in-flight duplicate of %s: %d, want 409", key, code)
					}
					return statements(n, p)
				}
				same, other := dup(h, counter, "k2"), dup(h2, counter2, "k3")
				t.Logf("%v %s: first execution %s; replay %s; in-flight duplicate (409): same process %s, another process %s",
					d, mode, statements(first, firstP), statements(replay, replayP), same, other)
			})
		}
	}
}

func statements(n, prepares int64) string {
	if prepares > 0 {
		return fmt.Sprintf("%d statements (+%d prepares)", n, prepares)
	}
	return fmt.Sprintf("%d statements", n)
}

// TestRoundTripsNamed: what a route named for the completer (core.Name)
// adds to a first execution's statements, per dialect and mode (BEGIN and
// COMMIT not counted), as docs/decisions.md ("The claim writes the mark,
// atomically") states it: nothing on Postgres (the claim's statement
// upserts the mark in a CTE), one statement on MySQL/MariaDB and SQLite
// (the mark, in the claim's transaction: the request's in atomic mode, a
// short one in leased mode).
func TestRoundTripsNamed(t *testing.T) {
	for _, d := range dialects {
		for _, leased := range []bool{false, true} {
			mode := map[bool]string{false: "atomic", true: "leased"}[leased]
			t.Run(d.String()+"/"+mode, func(t *testing.T) {
				st, _, counter, _ := newStoreAt(t, d)
				e, err := core.New(st, core.WithSingleCaller(), core.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
				if err != nil {
					t.Fatal(err)
				}
				var opts []core.RouteOption
				if leased {
					opts = append(opts, core.Leased())
				}
				handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusCreated) })
				plain := e.Handler(handler, append(opts, core.Scope("POST /plain"))...)
				named := e.Handler(handler, append(opts, core.Scope("POST /named"), core.Name("named"))...)
				send := func(h http.Handler, key string) int64 {
					t.Helper()
					r := httptest.NewRequest("POST", "/orders", strings.NewReader(`{"item":"coffee"}`))
					r.Header.Set(core.HeaderKey, key)
					w := httptest.NewRecorder()
					s0 := counter.Statements()
					h.ServeHTTP(w, r)
					if w.Code != http.StatusCreated {
						t.Fatalf("%s: %d %s", key, w.Code, w.Body)
					}
					return counter.Statements() - s0
				}
				send(plain, "warm-plain") // the drivers' prepares
				send(named, "warm-named")
				unnamed, withName := send(plain, "plain"), send(named, "named")
				want := unnamed + 1
				if d == sqlstore.Postgres {
					want = unnamed
				}
				t.Logf("%v %s: a first execution sends %d statements unnamed, %d named", d, mode, unnamed, withName)
				if withName != want {
					t.Errorf("a named route's first execution sent %d statements, the same route unnamed %d: want %d", withName, unnamed, want)
				}
			})
		}
	}
}
