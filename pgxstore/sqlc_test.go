package pgxstore_test

import (
	"context"
	"net/http"
	"testing"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/pgxstore"
)

// TestSqlcStyle runs Example_sqlc's handler: sqlc-style queries on the
// request's transaction (queries.WithTx(tx)); the order commits once, and
// a retry is replayed without a second order.
func TestSqlcStyle(t *testing.T) {
	ctx := context.Background()
	setup, _, _ := newStore(t)
	pool, _ := countedPool(t) // one connection: the TEMP table below is on it
	if _, err := pool.Exec(ctx, `CREATE TEMP TABLE orders (id BIGSERIAL PRIMARY KEY, item TEXT NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	store, err := pgxstore.New(pool, pgxstore.WithTable(setup.Table()))
	if err != nil {
		t.Fatal(err)
	}
	e, err := core.New(store, core.WithSingleCaller())
	if err != nil {
		t.Fatal(err)
	}
	queries := NewQueries(pool)
	h := e.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tx, err := pgxstore.Tx(r.Context())
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		if _, err := queries.WithTx(tx).CreateOrder(r.Context(), "book"); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusCreated)
	}))
	if w := serve(h, "sqlc"); w.Code != http.StatusCreated {
		t.Fatalf("first: %d %s", w.Code, w.Body)
	}
	if w := serve(h, "sqlc"); w.Code != http.StatusCreated || w.Header().Get("Idempotent-Replayed") != "true" {
		t.Fatalf("retry: %d %s, want the replayed 201", w.Code, w.Body)
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM orders`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 1 {
		t.Fatalf("%d orders, want 1", n)
	}
}
