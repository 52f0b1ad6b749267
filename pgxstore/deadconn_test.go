package pgxstore_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/store"
	"github.com/idemkit/idem/pgxstore"
	"github.com/idemkit/idem/sqlstore/sqlstoretest"
)

// deadPool returns a store on a pool of four connections, all idle and all
// closed by the server (pg_terminate_backend, as a database restart or a
// failover closes them), and the pool. The pool never pings on acquire:
// pgxpool's default pings only connections idle for over a second, so
// within that second it hands the dead ones out as this one does.
func deadPool(t *testing.T) (*pgxstore.Store, *pgxpool.Pool) {
	t.Helper()
	const size = 4
	pool := openPool(t, func(cfg *pgxpool.Config) {
		cfg.MaxConns, cfg.MinConns = size, 0
		cfg.ShouldPing = func(context.Context, pgxpool.ShouldPingParams) bool { return false }
	})
	table := sqlstoretest.Table()
	s, err := pgxstore.New(pool, pgxstore.WithTable(table))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	admin := openPool(t, nil)
	t.Cleanup(func() { _, _ = admin.Exec(context.Background(), "DROP TABLE IF EXISTS "+table) })
	var (
		conns []*pgxpool.Conn
		pids  []uint32
	)
	for range size {
		c, err := pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
		pids = append(pids, c.Conn().PgConn().PID())
	}
	for _, c := range conns {
		c.Release()
	}
	if st := pool.Stat(); st.IdleConns() != size {
		t.Fatalf("%d idle connections, want %d", st.IdleConns(), size)
	}
	if _, err := admin.Exec(ctx, "SELECT pg_terminate_backend(pid) FROM unnest($1::int[]) AS pid", pids); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; {
		var n int
		if err := admin.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE pid = ANY($1::int[])", pids).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d terminated backends still running", n)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if st := pool.Stat(); st.IdleConns() != size {
		t.Fatalf("%d idle connections after the terminations, want %d (all dead)", st.IdleConns(), size)
	}
	return s, pool
}

// TestDeadPooledConnections: after the server closed every idle connection
// of the pool (a restart, a failover, a proxy that cut them), the first
// request does not get 503 store-unavailable for each dead connection the
// pool hands out: a statement that cannot have committed anything (a
// read, BEGIN and the claim of a transaction that has not committed) runs
// again on another connection when its connection turns out to be lost,
// as database/sql retries a bad connection. Before, the BEGIN-and-claim
// batch was tried on two connections and the first request got 503.
func TestDeadPooledConnections(t *testing.T) {
	ctx := context.Background()
	t.Run("atomic request", func(t *testing.T) {
		s, _ := deadPool(t)
		e, err := core.New(s, core.WithSingleCaller(), core.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
		if err != nil {
			t.Fatal(err)
		}
		h := e.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			tx, err := pgxstore.Tx(r.Context())
			if err == nil {
				_, err = tx.Exec(r.Context(), "SELECT 1")
			}
			if err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			w.WriteHeader(http.StatusCreated)
		}))
		r := httptest.NewRequestWithContext(ctx, "POST", "/orders", strings.NewReader(`{}`))
		r.Header.Set(core.HeaderKey, "after-restart")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != http.StatusCreated {
			t.Fatalf("first request after the connections died: %d %s, want 201", w.Code, strings.TrimSpace(w.Body.String()))
		}
	})
	t.Run("handler's transaction before any claim", func(t *testing.T) {
		s, _ := deadPool(t)
		tctx, tx, err := s.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = tx.Rollback() }()
		ptx, err := pgxstore.Tx(tctx)
		if err != nil {
			t.Fatalf("Tx after the connections died: %v", err)
		}
		if _, err := ptx.Exec(tctx, "SELECT 1"); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("autocommit write that may have reached the server", func(t *testing.T) {
		// A statement that commits on its own is not sent again after its
		// connection was lost once it was sent: it may have committed.
		// Releasing an absent record succeeds; on a dead connection the
		// DELETE is written and the answer is the server's FATAL.
		s, _ := deadPool(t)
		id := store.Identity{Key: "absent"}.ID()
		if err := s.Release(ctx, id, 1); !errors.Is(err, core.ErrStoreUnavailable) {
			t.Fatalf("Release on a dead connection: %v, want core.ErrStoreUnavailable (not sent again)", err)
		}
		// A read goes on past the three other dead connections; then the
		// write finds a live one.
		if _, err := s.Get(ctx, id, time.Now()); !errors.Is(err, core.ErrNotFound) {
			t.Fatalf("Get: %v, want core.ErrNotFound", err)
		}
		if err := s.Release(ctx, id, 1); err != nil {
			t.Fatalf("Release on a live connection: %v", err)
		}
	})
	t.Run("read outside a transaction", func(t *testing.T) {
		s, _ := deadPool(t)
		id := store.Identity{Key: "absent"}.ID()
		if _, err := s.Get(ctx, id, time.Now()); !errors.Is(err, core.ErrNotFound) {
			t.Fatalf("Get after the connections died: %v, want core.ErrNotFound", err)
		}
		// Whether a failed statement lost its connection is decided before
		// the connection goes back to the pool, where another request may
		// be using it (go test -race): concurrent reads that fail
		// (pgx.ErrNoRows) on live connections.
		var wg sync.WaitGroup
		for range 16 {
			wg.Go(func() {
				for range 50 {
					if _, err := s.Get(ctx, id, time.Now()); !errors.Is(err, core.ErrNotFound) {
						t.Errorf("Get: %v, want core.ErrNotFound", err)
						return
					}
				}
			})
		}
		wg.Wait()
	})
}
