package sqlstoretest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/store"
	"github.com/idemkit/idem/sqlstore"
)

// The end of the transaction is part of the outcome (docs/contract.md,
// section 4, issue 21): in middleware-managed atomic mode the handler's
// transaction can end other than by the engine's successful commit (a
// constraint checked at COMMIT, the session killed while the handler
// waits on a provider, the server rolling the transaction back under the
// handler as a deadlock victim, the handler's own Commit or Rollback).
// Whatever the end, a marked effect never runs again and the client is
// told the truth: the engine reads the record in a transaction of its
// own, replays a committed answer, records an effect whose writes were
// lost as indeterminate, and releases a key whose attempt left nothing.

// txEnd is how the handler's transaction ends in a txEndCase.
type txEnd string

const (
	// endDeferred: a constraint checked at COMMIT fails (Postgres
	// DEFERRABLE INITIALLY DEFERRED unique, SQLite deferred foreign key).
	endDeferred txEnd = "deferred"
	// endKilled: the database kills the transaction's session while the
	// handler waits on its provider (idle_in_transaction_session_timeout,
	// idle_transaction_timeout, an operator's kill).
	endKilled txEnd = "killed"
	// endServerRollback: the server rolls the transaction back under the
	// handler while the client's transaction object still thinks it open
	// (a MariaDB deadlock victim: later statements run in autocommit).
	endServerRollback txEnd = "server-rollback"
	// endServerRollbackWrite: as endServerRollback, and the handler then
	// writes again (a "retry on deadlock" helper): that write runs in
	// autocommit and is committed, whatever the engine decides.
	endServerRollbackWrite txEnd = "server-rollback-write"
	// endHandlerRollback: the handler's own tx.Rollback() (a deferred
	// Rollback, the most common line in Go database code).
	endHandlerRollback txEnd = "handler-rollback"
	// endHandlerCommit: the handler's own tx.Commit().
	endHandlerCommit txEnd = "handler-commit"
)

// txEndServer is a payments handler in middleware-managed atomic mode
// whose transaction ends the way its request's ?end= says, after it
// marked its external effect when ?effect=1.
type txEndServer struct {
	*httptest.Server
	f       Fixture
	runs    atomic.Int64
	charges atomic.Int64 // effects marked: what a provider would have charged
	refused atomic.Int64 // EndTx refused by the store (its error names the fix)
}

func newTxEndServer(t *testing.T, f Fixture, d sqlstore.Dialect) *txEndServer {
	t.Helper()
	for name, fn := range map[string]bool{"Exec": f.Exec != nil, "QueryInt": f.QueryInt != nil, "Admin": f.Admin != nil, "EndTx": f.EndTx != nil} {
		if !fn {
			t.Fatalf("the fixture has no %s", name)
		}
	}
	s := &txEndServer{f: f}
	violate := deferredViolation(t, f, d)
	e := quietEngine(t, f)
	mux := http.NewServeMux()
	mux.Handle("POST /pay", e.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.runs.Add(1)
		ctx := r.Context()
		q := r.URL.Query()
		item := q.Get("item")
		if q.Get("effect") != "" {
			if err := core.MarkEffect(ctx); err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			s.charges.Add(1) // the provider charged
		}
		if err := f.Insert(ctx, item); err != nil {
			http.Error(w, "insert: "+err.Error(), http.StatusInternalServerError)
			return
		}
		var err error
		switch txEnd(q.Get("end")) {
		case endDeferred:
			err = violate(ctx, item)
		case endKilled:
			var pid int64
			switch d {
			case sqlstore.Postgres:
				if pid, err = f.QueryInt(ctx, "SELECT pg_backend_pid()"); err == nil {
					f.Admin(t, "SELECT pg_terminate_backend("+strconv.FormatInt(pid, 10)+")")
				}
			case sqlstore.MySQL:
				if pid, err = f.QueryInt(ctx, "SELECT CONNECTION_ID()"); err == nil {
					f.Admin(t, "KILL "+strconv.FormatInt(pid, 10))
				}
			default:
				err = fmt.Errorf("%v has no sessions to kill", d)
			}
		case endServerRollback:
			err = f.Exec(ctx, "ROLLBACK")
		case endServerRollbackWrite:
			if err = f.Exec(ctx, "ROLLBACK"); err == nil {
				err = f.Insert(ctx, item) // autocommit: committed
			}
		case endHandlerRollback, endHandlerCommit:
			if rerr := f.EndTx(ctx, txEnd(q.Get("end")) == endHandlerCommit); rerr != nil {
				if !errors.Is(rerr, core.ErrConfig) {
					err = fmt.Errorf("the store refused the handler's Commit or Rollback with an error that does not wrap core.ErrConfig: %w", rerr)
					break
				}
				s.refused.Add(1) // refused loudly: the engine's commit goes on
			}
		}
		if err != nil {
			http.Error(w, string(q.Get("end"))+": "+err.Error(), http.StatusTeapot) // the test's own failure: fails every assertion
			return
		}
		var id [8]byte
		_, _ = rand.Read(id[:])
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"charge":"ch_%s","item":%q}`, hex.EncodeToString(id[:]), item)
	})))
	s.Server = httptest.NewServer(mux)
	t.Cleanup(s.Close)
	return s
}

// deferredViolation creates a table whose constraint the database checks
// only at COMMIT, and returns the function that writes, in the
// transaction ctx carries, a row that violates it: each statement
// succeeds, the COMMIT fails (Postgres: a DEFERRABLE INITIALLY DEFERRED
// unique constraint; SQLite: a deferred foreign key). MySQL/MariaDB have no
// such constraints: the function fails.
func deferredViolation(t *testing.T, f Fixture, d sqlstore.Dialect) func(ctx context.Context, item string) error {
	t.Helper()
	table := "idem_d_" + Table()[len("idem_t_"):]
	switch d {
	case sqlstore.Postgres:
		f.Admin(t, "CREATE TABLE "+table+" (name VARCHAR(100) NOT NULL, CONSTRAINT "+table+"_u UNIQUE (name) DEFERRABLE INITIALLY DEFERRED)")
		t.Cleanup(func() { f.Admin(t, "DROP TABLE IF EXISTS "+table) })
		return func(ctx context.Context, item string) error {
			// Two rows of one name: each statement succeeds, the unique
			// constraint fails at COMMIT.
			err := f.Exec(ctx, "INSERT INTO "+table+" (name) VALUES ('"+item+"')")
			if err == nil {
				err = f.Exec(ctx, "INSERT INTO "+table+" (name) VALUES ('"+item+"')")
			}
			return err
		}
	case sqlstore.SQLite:
		f.Admin(t, "CREATE TABLE "+table+"_p (id INTEGER PRIMARY KEY)")
		f.Admin(t, "CREATE TABLE "+table+" (name VARCHAR(100) NOT NULL, parent INTEGER NOT NULL REFERENCES "+table+"_p(id) DEFERRABLE INITIALLY DEFERRED)")
		t.Cleanup(func() {
			f.Admin(t, "DROP TABLE IF EXISTS "+table)
			f.Admin(t, "DROP TABLE IF EXISTS "+table+"_p")
		})
		return func(ctx context.Context, item string) error {
			// A child of a parent that does not exist: the foreign key
			// fails at COMMIT.
			if on, err := f.QueryInt(ctx, "PRAGMA foreign_keys"); err != nil || on != 1 {
				return fmt.Errorf("SQLite enforces no foreign keys on this connection (PRAGMA foreign_keys = %d, %v): open it with _pragma=foreign_keys(1)", on, err)
			}
			return f.Exec(ctx, "INSERT INTO "+table+" (name, parent) VALUES ('"+item+"', 42)")
		}
	}
	return func(context.Context, string) error { return fmt.Errorf("%v has no constraints checked at COMMIT", d) }
}

// onceTransactionEnds: Engine.Once in a transaction of the engine's own,
// whose fn marks an effect and writes a row that fails a constraint at
// COMMIT: Once reports the outcome indeterminate, and a redelivery does
// not run fn again (before: ErrStoreUnavailable, and the redelivery ran it).
func (h *harness) onceTransactionEnds(t *testing.T) {
	d := h.cfg.Dialect
	if d == sqlstore.MySQL {
		t.Log("MySQL/MariaDB check no constraint at COMMIT; the other ends are in TransactionEnds")
		return
	}
	f, ctx := h.cfg.New(t), ctxT(t)
	violate := deferredViolation(t, f, d)
	e := quietEngine(t, f)
	msg := core.Message{Consumer: "payments", ID: "deferred-" + Table()[len("idem_t_"):]}
	runs := 0
	fn := func(ctx context.Context) ([]byte, error) {
		runs++
		if err := core.MarkEffect(ctx); err != nil {
			return nil, err
		}
		if err := f.Insert(ctx, msg.ID); err != nil {
			return nil, err
		}
		return []byte("charged"), violate(ctx, msg.ID)
	}
	for i := range 2 {
		if _, err := e.Once(ctx, msg, fn); !errors.Is(err, core.ErrIndeterminate) {
			t.Fatalf("delivery %d: %v, want an error wrapping core.ErrIndeterminate", i+1, err)
		}
	}
	if runs != 1 {
		t.Fatalf("fn ran %d times, want 1", runs)
	}
	if n := f.Count(t, msg.ID); n != 0 {
		t.Fatalf("%d business rows committed, want 0", n)
	}
}

// problemType is the slug of a problem document's type: what follows its
// last '#' or '/'.
func problemType(a answer) string {
	var p struct {
		Type string `json:"type"`
	}
	_ = json.Unmarshal(a.body, &p)
	return p.Type[strings.LastIndexAny(p.Type, "#/")+1:]
}

// transactionEnds: every way the transaction can end, with and without a
// marked effect, on every database the end exists on.
func (h *harness) transactionEnds(t *testing.T) {
	d := h.cfg.Dialect
	ends := []txEnd{endServerRollback, endServerRollbackWrite, endHandlerRollback, endHandlerCommit}
	switch d {
	case sqlstore.Postgres:
		ends = append(ends, endDeferred, endKilled)
	case sqlstore.MySQL:
		ends = append(ends, endKilled)
	case sqlstore.SQLite:
		ends = append(ends, endDeferred)
	}
	f := h.cfg.New(t)
	s := newTxEndServer(t, f, d)
	client := s.Client()
	for _, end := range ends {
		for _, effect := range []bool{true, false} {
			name := string(end)
			if effect {
				name += "/effect"
			}
			t.Run(name, func(t *testing.T) {
				ctx := ctxT(t) // each case its own failsafe
				item := strings.ReplaceAll(name, "/", "-") + "-" + Table()[len("idem_t_"):]
				key := "txend-" + item
				url := s.URL + "/pay?end=" + string(end) + "&item=" + item
				if effect {
					url += "&effect=1"
				}
				runs, charges, refused := s.runs.Load(), s.charges.Load(), s.refused.Load()
				first := post(ctx, client, url, key, `{}`)
				if first.err != nil {
					t.Fatal(first.err)
				}
				if first.status == http.StatusTeapot {
					t.Fatalf("the handler could not end its transaction: %s", first.body)
				}
				storeRefused := s.refused.Load() > refused
				committed := end == endHandlerCommit || storeRefused
				// The server rolled the transaction back under the handler
				// and the session left it: what the handler wrote after
				// that is committed in autocommit, and the engine cannot
				// tell whether it did, so the outcome is indeterminate
				// with or without a marked effect (never released).
				vanished := end == endServerRollback || end == endServerRollbackWrite
				switch {
				case committed:
					// The handler's writes and the claim committed (by the
					// handler itself, or by the engine once the store refused
					// the handler's call): the answer is the handler's, and
					// it is recorded.
					if first.status != http.StatusCreated || first.replayed {
						t.Fatalf("first request: %v, want the handler's 201 (its transaction committed)", first)
					}
				case effect || vanished:
					// The charge went out and the transaction's writes are
					// gone (or, vanished, some of them may be committed):
					// indeterminate, never the handler's 201.
					if first.status != http.StatusInternalServerError || problemType(first) != "outcome-unknown" {
						t.Fatalf("first request: %v, want 500 outcome-unknown (the effect was marked and the transaction did not commit)", first)
					}
				default:
					// Nothing happened and nothing was recorded: the truth
					// is "retry", never that another attempt took over.
					if first.status != http.StatusServiceUnavailable || first.retryAfter == "" {
						t.Fatalf("first request: %v (Retry-After %q), want 503 with Retry-After (nothing was recorded)", first, first.retryAfter)
					}
					if pt := problemType(first); pt == "lease-lost" || pt == "in-progress" {
						t.Fatalf("first request: %v: %s, but no other attempt took over", first, pt)
					}
				}
				for i := range 2 {
					again := postAfterEnd(ctx, client, url, key, `{}`)
					if again.err != nil {
						t.Fatal(again.err)
					}
					switch {
					case committed || effect || vanished:
						if !again.replayed || again.status != first.status || string(again.body) != string(first.body) {
							t.Fatalf("retry %d: %v, want the first answer replayed (%v)", i, again, first)
						}
					default:
						if again.status == http.StatusTeapot || again.replayed {
							t.Fatalf("retry %d: %v, want a fresh execution (the key was released)", i, again)
						}
					}
				}
				ran := s.runs.Load() - runs
				switch {
				case committed || effect || vanished:
					if ran != 1 {
						t.Fatalf("the handler ran %d times, want 1", ran)
					}
				default:
					if ran != 3 {
						t.Fatalf("the handler ran %d times, want 3 (each retry runs: the key was released)", ran)
					}
				}
				if effect && s.charges.Load()-charges != 1 {
					t.Fatalf("%d charges, want 1", s.charges.Load()-charges)
				}
				wantRows := 0
				if committed || end == endServerRollbackWrite {
					wantRows = 1 // server-rollback-write: the write after the rollback, in autocommit
				}
				if n := f.Count(t, item); n != wantRows {
					t.Fatalf("%d business rows committed, want %d", n, wantRows)
				}
			})
		}
	}
}

// liarStore wraps a TxStore whose transactions commit and then report a
// failure, as a COMMIT whose answer was lost on the wire does: the
// outcome is unknown to the engine, and committed.
type liarStore struct{ store.TxStore }

type liarTx struct{ store.Tx }

var errCommitLost = errors.New("sqlstoretest: the connection was lost during COMMIT")

func (s liarStore) Begin(ctx context.Context) (context.Context, store.Tx, error) {
	ctx, tx, err := s.TxStore.Begin(ctx)
	if err != nil {
		return ctx, tx, err
	}
	return ctx, liarTx{tx}, nil
}

func (t liarTx) Commit() error {
	if err := t.Tx.Commit(); err != nil {
		return err
	}
	return errCommitLost
}

// commitOutcomeUnknown: the COMMIT happened but its answer was lost. The
// engine reads the record: completed, so the handler's answer goes out
// (after MarkEffect or not), and the retry replays it.
func (h *harness) commitOutcomeUnknown(t *testing.T) {
	f, ctx := h.cfg.New(t), ctxT(t)
	f.Store = liarStore{f.Store}
	e := quietEngine(t, f)
	var runs atomic.Int64
	mux := http.NewServeMux()
	mux.Handle("POST /pay", e.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		if r.URL.Query().Get("effect") != "" {
			_ = core.MarkEffect(r.Context())
		}
		if err := f.Insert(r.Context(), r.URL.Query().Get("item")); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"n":%d}`, runs.Load())
	})))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	for _, effect := range []bool{false, true} {
		item := fmt.Sprintf("lost-commit-%v-%s", effect, Table()[len("idem_t_"):])
		url := srv.URL + "/pay?item=" + item
		if effect {
			url += "&effect=1"
		}
		before := runs.Load()
		first := post(ctx, srv.Client(), url, item, `{}`)
		if first.err != nil || first.status != http.StatusCreated || first.replayed {
			t.Fatalf("effect %v: first request: %v, want the handler's 201 (the commit happened)", effect, first)
		}
		again := post(ctx, srv.Client(), url, item, `{}`)
		if again.err != nil || again.status != http.StatusCreated || !again.replayed || string(again.body) != string(first.body) {
			t.Fatalf("effect %v: retry: %v, want the 201 replayed", effect, again)
		}
		if n := runs.Load() - before; n != 1 {
			t.Fatalf("effect %v: the handler ran %d times, want 1", effect, n)
		}
		if n := f.Count(t, item); n != 1 {
			t.Fatalf("effect %v: %d business rows, want 1", effect, n)
		}
	}
}
