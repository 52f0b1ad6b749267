package sqlstoretest

// The ends of a transaction that an adversarial review of issue 21's change
// found unsettled (each failed on that change): a leased attempt's
// transaction of local writes that does not commit with its completion,
// a refused COMMIT of the handler's own on SQLite, a claim the handler
// committed before its process died, a panic after MarkEffect. RunAtomic
// and RunLifetime run them.

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/sqlstore"
)

func lifetimeEngine(t *testing.T, f Fixture, lease time.Duration) *core.Engine {
	t.Helper()
	quiet := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError + 4}))
	e, err := core.New(f.Store, core.WithSingleCaller(), core.WithLease(lease), core.WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// leasedLocalCommitFails: a Leased route writes its rows in the attempt's
// own transaction (the documented shape), no MarkEffect, and one of its
// rows fails a constraint checked at COMMIT. The completion and the rows
// roll back together, so the 201 is not true; yet the engine delivers it
// (leased mode delivers the handler's answer whenever the completion
// fails without an effect), and the key stays in progress until the
// lease lapses.
func leasedLocalCommitFails(t *testing.T, cfg Config) {
	if cfg.Dialect == sqlstore.MySQL {
		t.Log("MySQL/MariaDB check no constraint at COMMIT")
		return
	}
	f := cfg.New(t)
	violate := deferredViolation(t, f, cfg.Dialect)
	e := lifetimeEngine(t, f, 5*time.Second)
	mux := http.NewServeMux()
	mux.Handle("POST /transfers", e.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		item := r.URL.Query().Get("item")
		if err := f.Insert(r.Context(), item); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		if err := violate(r.Context(), item); err != nil {
			http.Error(w, err.Error(), http.StatusTeapot)
			return
		}
		w.WriteHeader(http.StatusCreated)
		fmt.Fprint(w, `{"ok":true}`)
	}), core.Leased()))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	ctx := ctxT(t)
	item := "leased-deferred-" + Table()[len("idem_t_"):]
	first := post(ctx, srv.Client(), srv.URL+"/transfers?item="+item, item, `{}`)
	if first.err != nil {
		t.Fatal(first.err)
	}
	rows := f.Count(t, item)
	if first.status == http.StatusCreated && rows == 0 {
		t.Fatalf("first request: %v, but its rows did not commit (%d rows): a 2xx whose writes are gone", first, rows)
	}
	again := post(ctx, srv.Client(), srv.URL+"/transfers?item="+item, item, `{}`)
	if again.err != nil {
		t.Fatal(again.err)
	}
	if again.status == http.StatusConflict && !again.replayed {
		t.Fatalf("retry: %v: the key is held in progress by an attempt that has ended (nothing was recorded, nothing committed)", again)
	}
}

// leasedLocalHandlerCommit: a Leased route's handler commits the
// attempt's own transaction itself (sqlstore.Tx(ctx).Commit(), the
// misuse issue 21 item 3 is about, settled in atomic mode). Its rows are
// durable, the completion then fails (the transaction is done), the
// handler's 201 is delivered, the record stays in progress, and once the
// lease lapses a retry takes over and runs the handler again: the local
// writes twice (issue 21 item 5's double debit).
func leasedLocalHandlerCommit(t *testing.T, cfg Config) {
	f := cfg.New(t)
	if f.EndTx == nil {
		t.Log("the fixture has no EndTx")
		return
	}
	e := lifetimeEngine(t, f, 200*time.Millisecond)
	var runs, refused atomic.Int64
	mux := http.NewServeMux()
	mux.Handle("POST /transfers", e.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		item := r.URL.Query().Get("item")
		if err := f.Insert(r.Context(), item); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		if err := f.EndTx(r.Context(), true); err != nil {
			if !errors.Is(err, core.ErrConfig) {
				http.Error(w, err.Error(), http.StatusTeapot)
				return
			}
			refused.Add(1)
		}
		w.WriteHeader(http.StatusCreated)
		fmt.Fprint(w, `{"debited":true}`)
	}), core.Leased()))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	ctx := ctxT(t)
	item := "leased-handler-commit-" + Table()[len("idem_t_"):]
	first := post(ctx, srv.Client(), srv.URL+"/transfers?item="+item, item, `{}`)
	if first.err != nil || first.status == http.StatusTeapot {
		t.Fatalf("first request: %v", first)
	}
	time.Sleep(600 * time.Millisecond) // past the lease
	again := post(ctx, srv.Client(), srv.URL+"/transfers?item="+item, item, `{}`)
	if again.err != nil {
		t.Fatal(again.err)
	}
	if n := f.Count(t, item); n > 1 || runs.Load() > 1 {
		t.Fatalf("first %v, retry %v: the handler ran %d times, %d rows committed (store refused the handler's Commit: %v), want 1 and 1", first, again, runs.Load(), n, refused.Load() > 0)
	}
}

// leasedLocalFailedStatement: a Leased route marks its effect (a charge
// with its downstream key), then a statement of its own transaction
// fails (a unique violation: on Postgres the transaction is aborted) and
// it answers 409. Atomic mode records that 409 (afterAbort); leased mode
// answers 503 outcome-pending, records nothing, and every takeover runs
// the handler again, to the same end: the outcome is never settled.
func leasedLocalFailedStatement(t *testing.T, cfg Config) {
	f := cfg.New(t)
	if f.Unique == nil {
		t.Log("the fixture has no Unique")
		return
	}
	e := lifetimeEngine(t, f, 200*time.Millisecond)
	var runs atomic.Int64
	mux := http.NewServeMux()
	mux.Handle("POST /transfers", e.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		ctx := r.Context()
		item := r.URL.Query().Get("item")
		if err := core.MarkEffect(ctx); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		// the provider is charged here, with DownstreamKey(ctx, "charge")
		if err := f.Unique(ctx, item); err != nil {
			http.Error(w, err.Error(), http.StatusTeapot)
			return
		}
		if err := f.Unique(ctx, item); err == nil {
			http.Error(w, "the second row of one name was accepted", http.StatusTeapot)
			return
		}
		w.WriteHeader(http.StatusConflict)
		fmt.Fprint(w, `{"error":"duplicate transfer"}`)
	}), core.Leased()))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	ctx := ctxT(t)
	item := "leased-failed-stmt-" + Table()[len("idem_t_"):]
	first := post(ctx, srv.Client(), srv.URL+"/transfers?item="+item, item, `{}`)
	if first.err != nil || first.status == http.StatusTeapot {
		t.Fatalf("first request: %v", first)
	}
	var answers []answer
	for range 2 {
		time.Sleep(400 * time.Millisecond) // past the lease
		a := post(ctx, srv.Client(), srv.URL+"/transfers?item="+item, item, `{}`)
		answers = append(answers, a)
	}
	if runs.Load() != 1 || first.status != http.StatusConflict {
		t.Fatalf("first %v, retries %v %v: the handler ran %d times, want its 409 once, then replayed (as in atomic mode)", first, answers[0], answers[1], runs.Load())
	}
}

// atomicHandlerCommitRefused: SQLite, atomic mode: the handler commits the
// shared transaction itself and SQLite refuses the COMMIT (a deferred
// foreign key), which leaves the transaction open on its connection;
// the handler answers 500. The engine's Rollback of its pinned
// transaction then fails (sql.ErrTxDone) and gives the connection back to
// the pool still in the open transaction, holding SQLite's write lock:
// every later write waits busy_timeout and fails.
func atomicHandlerCommitRefused(t *testing.T, cfg Config) {
	if cfg.Dialect != sqlstore.SQLite {
		t.Log("SQLite leaves a refused COMMIT's transaction open")
		return
	}
	f := cfg.New(t)
	if f.EndTx == nil {
		t.Log("the fixture has no EndTx")
		return
	}
	violate := deferredViolation(t, f, cfg.Dialect)
	e := lifetimeEngine(t, f, 5*time.Second)
	mux := http.NewServeMux()
	mux.Handle("POST /pay", e.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := r.Context()
		item := r.URL.Query().Get("item")
		if err := f.Insert(ctx, item); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		if r.URL.Query().Get("bad") != "" {
			if err := violate(ctx, item); err != nil {
				http.Error(w, err.Error(), http.StatusTeapot)
				return
			}
			if err := f.EndTx(ctx, true); err != nil {
				http.Error(w, "commit: "+err.Error(), http.StatusInternalServerError)
				return
			}
		}
		w.WriteHeader(http.StatusCreated)
	})))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	ctx := ctxT(t)
	item := "refused-commit-" + Table()[len("idem_t_"):]
	first := post(ctx, srv.Client(), srv.URL+"/pay?bad=1&item="+item, item, `{}`)
	if first.err != nil || first.status == http.StatusTeapot {
		t.Fatalf("first request: %v", first)
	}
	for i := range 4 {
		k := item + "-next-" + strconv.Itoa(i)
		a := post(ctx, srv.Client(), srv.URL+"/pay?item="+k, k, `{}`)
		if a.err != nil || a.status != http.StatusCreated {
			t.Fatalf("an unrelated request %d after the refused COMMIT: %v (%s), want 201", i, a, a.latency)
		}
	}
}

// atomicHandlerCommitThenCrash: atomic mode, the handler commits the
// shared transaction itself (the claim commits in progress, with no
// lease: atomic claims carry none) and the process dies before the
// engine's afterEnd records the answer (here: the handler never returns;
// the same holds when afterEnd's Get or recordOwn's Complete fails). Every
// retry, on any replica, gets 409 in-progress until the record expires
// (24 h by default): the locked key issue 21 item 3 is about, still there
// after a crash. An atomic claim whose attempt is past MaxAttempt cannot
// be alive; the retry should get an answer that settles it.
func atomicHandlerCommitThenCrash(t *testing.T, cfg Config) {
	f := cfg.New(t)
	if f.EndTx == nil || f.Twin == nil {
		t.Log("the fixture has no EndTx or Twin")
		return
	}
	e := lifetimeEngine(t, f, 5*time.Second)
	crashed := make(chan struct{})
	var refused atomic.Bool
	entered := make(chan struct{}, 1)
	pay := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := r.Context()
		if err := f.Insert(ctx, r.URL.Query().Get("item")); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		if err := f.EndTx(ctx, true); err != nil {
			refused.Store(true) // pgxstore refuses it: nothing to show
		}
		entered <- struct{}{}
		<-crashed // the process dies here
		w.WriteHeader(http.StatusCreated)
	})
	route := []core.RouteOption{core.MaxAttempt(300 * time.Millisecond)}
	srv := httptest.NewServer(e.Handler(pay, route...))
	t.Cleanup(srv.Close)
	f2 := f
	f2.Store = f.Twin(t)
	e2 := lifetimeEngine(t, f2, 5*time.Second)
	srv2 := httptest.NewServer(e2.Handler(pay, route...))
	t.Cleanup(srv2.Close)
	t.Cleanup(func() { close(crashed) }) // before the servers close
	ctx := ctxT(t)
	item := "commit-crash-" + Table()[len("idem_t_"):]
	first := make(chan answer, 1)
	go func() { first <- post(ctx, srv.Client(), srv.URL+"/pay?item="+item, item, `{}`) }()
	select {
	case <-entered:
	case a := <-first:
		t.Fatalf("the first request answered before its handler committed: %v", a)
	}
	if refused.Load() {
		t.Log("the store refused the handler's Commit")
		return
	}
	time.Sleep(time.Second) // well past MaxAttempt
	retry := post(ctx, srv2.Client(), srv2.URL+"/pay?item="+item, item, `{}`)
	if retry.status == http.StatusConflict && problemType(retry) == "in-progress" {
		t.Fatalf("a retry on another replica, past the attempt's MaxAttempt: %v: the key stays locked until the record expires", retry)
	}
}

// panicAfterEffectCommitsPartialWrites: after MarkEffect a handler writes
// the first of its two rows (a debit) and panics before the second (the
// credit). The record becomes indeterminate, as it must, but the
// indeterminate completion commits in the handler's transaction, with the
// half-done writes (atomic mode, and now the leased attempt's local
// transaction too). A resolver that then finds the charge not applied
// releases the key, and the retry writes the debit again.
func panicAfterEffectCommitsPartialWrites(t *testing.T, cfg Config) {
	for _, leased := range []bool{false, true} {
		t.Run(fmt.Sprintf("leased=%v", leased), func(t *testing.T) {
			f := cfg.New(t)
			e := lifetimeEngine(t, f, 5*time.Second)
			var opts []core.RouteOption
			if leased {
				opts = append(opts, core.Leased())
			}
			h := e.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				ctx := r.Context()
				if err := core.MarkEffect(ctx); err != nil {
					http.Error(w, err.Error(), http.StatusInternalServerError)
					return
				}
				if err := f.Insert(ctx, r.URL.Query().Get("item")); err != nil { // the debit
					http.Error(w, err.Error(), http.StatusInternalServerError)
					return
				}
				panic("bug before the credit")
			}), opts...)
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				defer func() { _ = recover() }()
				h.ServeHTTP(w, r)
			}))
			t.Cleanup(srv.Close)
			item := fmt.Sprintf("panic-partial-%v-%s", leased, Table()[len("idem_t_"):])
			a := post(ctxT(t), srv.Client(), srv.URL+"/pay?item="+item, item, `{}`)
			if n := f.Count(t, item); n != 0 {
				t.Fatalf("answer %v; %d rows of the panicking handler committed with the indeterminate record, want 0 (all or nothing)", a, n)
			}
		})
	}
}
