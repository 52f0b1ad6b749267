package pgxstore_test

import (
	"context"
	"encoding/json"
	"net/http"
	"os"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/pgxstore"
)

// DBTX and Queries are what sqlc generates for a query file (trimmed to
// one query): *pgxpool.Pool, *pgx.Conn and any pgx.Tx satisfy DBTX, and
// WithTx runs the queries in a transaction.
type DBTX interface {
	Exec(context.Context, string, ...interface{}) (pgconn.CommandTag, error)
	Query(context.Context, string, ...interface{}) (pgx.Rows, error)
	QueryRow(context.Context, string, ...interface{}) pgx.Row
}

type Queries struct{ db DBTX }

func NewQueries(db DBTX) *Queries { return &Queries{db: db} }

func (q *Queries) WithTx(tx pgx.Tx) *Queries { return &Queries{db: tx} }

const createOrder = `INSERT INTO orders (item) VALUES ($1) RETURNING id`

func (q *Queries) CreateOrder(ctx context.Context, item string) (int64, error) {
	var id int64
	err := q.db.QueryRow(ctx, createOrder, item).Scan(&id)
	return id, err
}

// Middleware-managed atomic mode with sqlc: the handler runs its queries
// on the request's transaction (pgxstore.Tx), and the order, the key and
// the recorded response commit together before the client gets the
// answer. The claim travels with BEGIN and the completion with COMMIT: the
// route makes as many round trips as it would unprotected.
func Example_sqlc() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		panic(err)
	}
	store, err := pgxstore.New(pool)
	if err != nil {
		panic(err)
	}
	if err := store.Migrate(ctx); err != nil {
		panic(err)
	}
	e, err := core.New(store, core.WithSingleCaller())
	if err != nil {
		panic(err)
	}
	queries := NewQueries(pool)
	mux := http.NewServeMux()
	mux.Handle("POST /orders", e.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tx, err := pgxstore.Tx(r.Context()) // core.ErrNoTx with a context that is not the request's
		if err != nil {
			http.Error(w, "internal error", http.StatusInternalServerError)
			return
		}
		id, err := queries.WithTx(tx).CreateOrder(r.Context(), r.FormValue("item"))
		if err != nil {
			http.Error(w, "internal error", http.StatusInternalServerError) // a 5xx rolls everything back
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_ = json.NewEncoder(w).Encode(map[string]int64{"id": id})
	})))
	_ = http.ListenAndServe(":8080", mux)
}

// Caller-managed atomic mode: a queue consumer that holds its own pgx.Tx
// joins it with pgxstore.WithTx; the message's effect and its record
// commit together, when the consumer commits.
func Example_callerManaged() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		panic(err)
	}
	store, err := pgxstore.New(pool)
	if err != nil {
		panic(err)
	}
	e, err := core.New(store, core.WithSingleCaller())
	if err != nil {
		panic(err)
	}
	queries := NewQueries(pool)
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := e.Once(pgxstore.WithTx(ctx, tx), core.Message{Consumer: "orders", ID: "msg-42"},
			func(ctx context.Context) ([]byte, error) {
				id, err := queries.WithTx(tx).CreateOrder(ctx, "book")
				if err != nil {
					return nil, err
				}
				return json.Marshal(id)
			})
		return err
	})
	if err != nil {
		panic(err)
	}
}
