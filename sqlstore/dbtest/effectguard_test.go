package dbtest_test

// The effect guard (core.MarkEffect in atomic mode, docs/contract.md
// section 4): a transaction that ends without the engine after MarkEffect
// (a COMMIT lost with the database out of reach or with the session kept
// by the server, a session killed while the handler waits on its
// provider) never lets a retry run the effect again. Found by an
// adversarial review (2026-12-08); each test failed before the guard.

import (
	"bytes"
	"context"
	"database/sql"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/sqlstore"
	"github.com/idemkit/idem/sqlstore/sqlstoretest"
)

func guardEngine(t *testing.T, s core.Option, st *sqlstore.Store) *core.Engine {
	t.Helper()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	opts := []core.Option{core.WithSingleCaller(), core.WithLogger(quiet)}
	if s != nil {
		opts = append(opts, s)
	}
	e, err := core.New(st, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

type guardAnswer struct {
	status int
	body   string
	replay bool
}

func guardPost(h http.Handler, key string) guardAnswer {
	r := httptest.NewRequest(http.MethodPost, "/pay", strings.NewReader(`{"amount":100}`))
	r.Header.Set("Content-Type", "application/json")
	r.Header.Set("Idempotency-Key", key)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return guardAnswer{status: w.Code, body: w.Body.String(), replay: w.Header().Get("Idempotent-Replayed") == "true"}
}

// commitProxy forwards TCP connections to a Postgres server. Once armed,
// the first simple-protocol "commit" a client sends is swallowed: the
// client's side of that connection is closed (as a network fault does),
// while the server's side stays open, its transaction idle and holding
// its locks, until release. A partition during COMMIT looks so to both
// ends: the server keeps the session until its TCP keepalive notices
// (two hours by default), the client sees its connection fail.
type commitProxy struct {
	ln      net.Listener
	target  string
	armed   atomic.Bool
	mu      sync.Mutex
	orphans []net.Conn
	cut     chan struct{}
	// outage: at the cut the server's side closes too (the server rolls
	// the transaction back) and the database stays unreachable (new
	// connections are refused) until down is cleared.
	outage bool
	down   atomic.Bool
	live   []net.Conn // every connection, both sides (closed at an outage)
}

func newCommitProxy(t *testing.T, target string) *commitProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &commitProxy{ln: ln, target: target, cut: make(chan struct{}, 1)}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go p.serve(c)
		}
	}()
	t.Cleanup(func() { ln.Close(); p.release() })
	return p
}

func (p *commitProxy) serve(client net.Conn) {
	if p.down.Load() {
		client.Close()
		return
	}
	server, err := net.Dial("tcp", p.target)
	if err != nil {
		client.Close()
		return
	}
	p.mu.Lock()
	p.live = append(p.live, client, server)
	p.mu.Unlock()
	go func() { _, _ = io.Copy(client, server); client.Close() }()
	buf := make([]byte, 64<<10)
	for {
		n, err := client.Read(buf)
		if n > 0 {
			chunk := buf[:n]
			if p.armed.Load() && bytes.Contains(bytes.ToLower(chunk), []byte("commit\x00")) && p.armed.CompareAndSwap(true, false) {
				// The COMMIT is lost; the client's connection breaks.
				if p.outage {
					p.down.Store(true)
					p.mu.Lock()
					for _, c := range p.live {
						c.Close()
					}
					p.live = nil
					p.mu.Unlock()
				} else {
					p.mu.Lock()
					p.orphans = append(p.orphans, server)
					p.mu.Unlock()
				}
				client.Close()
				p.cut <- struct{}{}
				return
			}
			if _, werr := server.Write(chunk); werr != nil {
				client.Close()
				return
			}
		}
		if err != nil {
			server.Close()
			return
		}
	}
}

// release closes the server's side of the orphaned sessions: the server
// rolls their transactions back.
func (p *commitProxy) release() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.orphans {
		c.Close()
	}
	p.orphans = nil
}

// TestEffectGuardCommitLostSessionKept: Postgres, atomic mode, the
// handler marks its external effect (the charge) and writes its row; the
// COMMIT never reaches the server and the client's connection breaks,
// while the server keeps the session (idle in transaction, holding the
// claim's advisory lock). The contract: "a connection lost during COMMIT
// so the outcome is unknown ... absent, after MarkEffect: indeterminate
// ... A marked effect never runs again because a commit failed."
// afterAbort claims again for abortedHolderWait (3 s), gives up and answers
// 409 in-progress having recorded nothing; once the server reaps the
// session (rolled back), the retry finds no record and charges again.
func TestEffectGuardCommitLostSessionKept(t *testing.T) { lostCommit(t, false) }

// TestEffectGuardCommitLostStoreDown: as above, but the database is
// unreachable for a moment at the COMMIT (a failover, a network blip):
// the session dies with the connection (rolled back), afterEnd cannot
// read the record and answers 503 outcome-pending ("the retry reads it
// again", docs/contract.md section 4), having recorded nothing. The
// retry, once the database is back, finds no record and charges again.
func TestEffectGuardCommitLostStoreDown(t *testing.T) { lostCommit(t, true) }

func lostCommit(t *testing.T, outage bool) {
	dsn := sqlstoretest.DSN(t, sqlstoretest.EnvPostgres)
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	proxy := newCommitProxy(t, u.Host)
	proxy.outage = outage
	u.Host = proxy.ln.Addr().String()
	cfg, err := pgx.ParseConfig(u.String())
	if err != nil {
		t.Fatal(err)
	}
	db := sql.OpenDB(stdlib.GetConnector(*cfg))
	t.Cleanup(func() { db.Close() })
	st, err := sqlstore.New(db, sqlstore.Postgres, sqlstore.WithTable(sqlstoretest.Table()))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	orders := st.Table() + "_orders"
	if _, err := db.Exec("CREATE TABLE " + orders + " (name TEXT NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		proxy.release()
		for _, tb := range []string{orders, st.Table(), st.Table() + "_marks"} {
			_, _ = db.Exec("DROP TABLE IF EXISTS " + tb)
		}
	})
	e := guardEngine(t, nil, st)
	var runs, charges atomic.Int64
	h := e.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		ctx := r.Context()
		if err := core.MarkEffect(ctx); err != nil {
			http.Error(w, err.Error(), 500)
			return
		}
		charges.Add(1) // the provider charged the card
		tx, err := sqlstore.Tx(ctx)
		if err != nil {
			http.Error(w, err.Error(), 500)
			return
		}
		if _, err := tx.ExecContext(ctx, "INSERT INTO "+orders+" (name) VALUES ('order-1')"); err != nil {
			http.Error(w, err.Error(), 500)
			return
		}
		if runs.Load() == 1 {
			proxy.armed.Store(true) // the network fails during the first COMMIT
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprint(w, `{"charged":true}`)
	}))
	start := time.Now()
	first := guardPost(h, "lost-commit")
	t.Logf("first: %d %s (after %s)", first.status, first.body, time.Since(start).Round(time.Millisecond))
	select {
	case <-proxy.cut:
	case <-time.After(10 * time.Second):
		t.Fatal("the proxy never saw the COMMIT")
	}
	if first.status != http.StatusServiceUnavailable || !strings.Contains(first.body, "outcome-pending") {
		t.Fatalf("first: %d %s, want 503 outcome-pending (the outcome is unknown and could not be settled yet)", first.status, first.body)
	}
	// The server reaps the orphaned session (TCP keepalive,
	// idle_in_transaction_session_timeout, an operator): rolled back.
	// Or the database is reachable again.
	proxy.release()
	proxy.down.Store(false)
	time.Sleep(300 * time.Millisecond)
	var n int
	if err := db.QueryRow("SELECT COUNT(*) FROM " + st.Table()).Scan(&n); err != nil {
		t.Fatal(err)
	}
	t.Logf("records in the table before the retry: %d", n)
	time.Sleep(300 * time.Millisecond)
	retry := guardPost(h, "lost-commit")
	t.Logf("retry: %d %s replayed=%v", retry.status, retry.body, retry.replay)
	if charges.Load() != 1 {
		t.Fatalf("the handler marked its effect and charged %d times for one key (ran %d times), want 1: the first attempt's outcome was unknown, and the retry must not run the effect again", charges.Load(), runs.Load())
	}
	if retry.status != http.StatusInternalServerError || !strings.Contains(retry.body, "outcome-unknown") {
		t.Fatalf("retry: %d %s, want 500 outcome-unknown (an earlier attempt's effect may have happened)", retry.status, retry.body)
	}
	again := guardPost(h, "lost-commit")
	if !again.replay || again.status != retry.status || again.body != retry.body {
		t.Fatalf("second retry: %+v, want the indeterminate answer replayed (%+v)", again, retry)
	}
	var rows int
	if err := db.QueryRow("SELECT COUNT(*) FROM " + orders).Scan(&rows); err != nil {
		t.Fatal(err)
	}
	if rows != 0 {
		t.Fatalf("%d order rows committed, want 0 (the first transaction was lost, the retry's rolled back)", rows)
	}
}

// TestEffectGuardKilledSessionRetryElsewhere: atomic mode, the
// handler marks its effect and, while it waits on its provider, the
// database kills its session (idle_in_transaction_session_timeout, an
// operator): the claim goes with the transaction. A client retry that
// reaches another replica (another process on the same table) in that
// window finds no claim and no lock, claims, and runs the handler again:
// a second charge, although the first attempt marked its effect. The
// first attempt's afterAbort then finds the identity held by the retry
// and answers 409.
func TestEffectGuardKilledSessionRetryElsewhere(t *testing.T) {
	for _, d := range []sqlstore.Dialect{sqlstore.Postgres, sqlstore.MySQL} {
		t.Run(d.String(), func(t *testing.T) {
			f := fixture(t, d)
			e1 := guardEngine(t, nil, f.Store.(*sqlstore.Store))
			e2 := guardEngine(t, nil, f.Twin(t).(*sqlstore.Store))
			var charges atomic.Int64
			killed, retried := make(chan struct{}), make(chan struct{})
			pay := func(first bool) http.Handler {
				return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					ctx := r.Context()
					if err := core.MarkEffect(ctx); err != nil {
						http.Error(w, err.Error(), 500)
						return
					}
					charges.Add(1) // the provider is called
					if err := f.Insert(ctx, "order-k"); err != nil {
						http.Error(w, err.Error(), 500)
						return
					}
					if first {
						q := "SELECT pg_backend_pid()"
						kill := "SELECT pg_terminate_backend(%d)"
						if d == sqlstore.MySQL {
							q, kill = "SELECT CONNECTION_ID()", "KILL %d"
						}
						pid, err := f.QueryInt(ctx, q)
						if err != nil {
							http.Error(w, err.Error(), 500)
							return
						}
						f.Admin(t, fmt.Sprintf(kill, pid)) // the session dies while the provider answers slowly
						close(killed)
						<-retried
					}
					w.WriteHeader(http.StatusCreated)
					fmt.Fprint(w, `{"charged":true}`)
				})
			}
			h1, h2 := e1.Handler(pay(true)), e2.Handler(pay(false))
			done := make(chan guardAnswer, 1)
			go func() { done <- guardPost(h1, "killed-key") }()
			<-killed
			time.Sleep(200 * time.Millisecond) // the server has ended the session
			retry := guardPost(h2, "killed-key")
			close(retried)
			first := <-done
			t.Logf("first (replica 1): %d %s", first.status, first.body)
			t.Logf("retry (replica 2, while the first still ran): %d %s", retry.status, retry.body)
			if charges.Load() != 1 {
				t.Fatalf("%d charges for one key, want 1: the retry on another replica must not run the effect of an attempt whose session died after it marked its effect", charges.Load())
			}
			if retry.status != http.StatusInternalServerError || !strings.Contains(retry.body, "outcome-unknown") {
				t.Fatalf("retry: %d %s, want 500 outcome-unknown", retry.status, retry.body)
			}
			if first.status < 400 {
				t.Fatalf("first: %d %s, want an error (its transaction was killed: its 201 is not true)", first.status, first.body)
			}
			for _, h := range []http.Handler{h1, h2} {
				again := guardPost(h, "killed-key")
				if again.status != http.StatusInternalServerError || !strings.Contains(again.body, "outcome-unknown") {
					t.Fatalf("a later retry: %+v, want 500 outcome-unknown", again)
				}
			}
		})
	}
}
