// Command pgx is the README's native pgx store quick start (README.md,
// "Quick starts"; pgxstore/README.md): Postgres through a *pgxpool.Pool.
package main

import (
	"context"
	"log"
	"net/http"
	"os"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/pgxstore"
)

func main() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	store, err := pgxstore.New(pool) // sqlstore's Postgres table and SQL
	if err != nil {
		log.Fatal(err)
	}
	_ = store.Migrate(ctx)
	if err := store.Check(ctx); err != nil {
		log.Fatal(err) // names the fix: "run store.Migrate", ...
	}
	e, err := core.New(store, core.WithCaller(func(r *http.Request) (string, error) {
		return r.Header.Get("Authorization"), nil
	}))
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("POST /orders", e.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tx, err := pgxstore.Tx(r.Context()) // a pgx.Tx: tx.Exec(...), or sqlc's queries.WithTx(tx)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		if _, err := tx.Exec(r.Context(), `SELECT 1`); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusCreated)
	})))
	log.Fatal(http.ListenAndServe("127.0.0.1:8080", mux))
}
