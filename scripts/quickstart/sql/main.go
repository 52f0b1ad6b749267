// Command sql is the README's database/sql store quick start (README.md,
// "Quick starts"; sqlstore/README.md), on SQLite (modernc.org/sqlite); the
// same code runs on Postgres and MySQL/MariaDB with their drivers and
// sqlstore.Postgres or sqlstore.MySQL. It also consumes messages with
// Engine.Once (README.md, "Message consumers").
package main

import (
	"context"
	"database/sql"
	"errors"
	"log"
	"net/http"

	_ "modernc.org/sqlite"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/sqlstore"
)

func main() {
	ctx := context.Background()
	db, err := sql.Open("sqlite", "quickstart.db") // or "pgx", "mysql"
	if err != nil {
		log.Fatal(err)
	}
	store, err := sqlstore.New(db, sqlstore.SQLite) // sqlstore.Postgres, sqlstore.MySQL
	if err != nil {
		log.Fatal(err)
	}
	_ = store.Migrate(ctx)                   // or sqlstore/migrations with golang-migrate or goose
	if err := store.Check(ctx); err != nil { // dialect vs server, table shape, at start-up
		log.Fatal(err)
	}
	e, err := core.New(store, core.WithCaller(func(r *http.Request) (string, error) {
		return r.Header.Get("Authorization"), nil
	}))
	if err != nil {
		log.Fatal(err)
	}

	// A message consumer, in a transaction of its own (Once begins it) or
	// in one the code already holds (sqlstore.WithTx).
	res, err := e.Once(ctx, core.Message{Consumer: "mailer", ID: "m-1"}, func(ctx context.Context) ([]byte, error) {
		tx, err := sqlstore.Tx(ctx)
		if err != nil {
			return nil, err
		}
		_, err = tx.ExecContext(ctx, `SELECT 1`)
		return []byte("sent"), err
	})
	if errors.Is(err, core.ErrInProgress) {
		log.Print("in flight elsewhere: nack") // declined at once
	} else if err != nil {
		log.Fatal(err)
	}
	log.Printf("mailer: %s (replayed: %v)", res.Value, res.Replayed)

	mux := http.NewServeMux()
	mux.Handle("POST /orders", e.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tx, err := sqlstore.Tx(r.Context()) // an error (core.ErrNoTx), never nil, if r.Context() has none
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		if _, err := tx.ExecContext(r.Context(), `SELECT 1`); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusCreated)
	})))
	// A database/sql repository written against sqlstore.Beginner joins the
	// request's transaction.
	var repo sqlstore.Beginner = sqlstore.Joining(db)
	_ = repo
	log.Fatal(http.ListenAndServe("127.0.0.1:8080", mux))
}
