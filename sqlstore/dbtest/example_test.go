package dbtest_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"

	_ "modernc.org/sqlite"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/sqlstore"
)

// openExampleDB opens a SQLite file with the settings the README
// recommends, with the store's table and an orders table.
func openExampleDB() (*sql.DB, *sqlstore.Store, func()) {
	dir, err := os.MkdirTemp("", "sqlstore-example")
	if err != nil {
		panic(err)
	}
	db, err := sql.Open("sqlite", "file:"+filepath.Join(dir, "app.db")+
		"?_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)&_txlock=immediate")
	if err != nil {
		panic(err)
	}
	store, err := sqlstore.New(db, sqlstore.SQLite)
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	if err := store.Migrate(ctx); err != nil {
		panic(err)
	}
	if _, err := db.ExecContext(ctx, `CREATE TABLE orders (id INTEGER PRIMARY KEY, item TEXT NOT NULL)`); err != nil {
		panic(err)
	}
	return db, store, func() { db.Close(); os.RemoveAll(dir) }
}

// Middleware-managed atomic mode: the engine begins the transaction, the
// handler writes through sqlstore.Tx(r.Context()), and the order, the
// key and the recorded response commit together before the client gets
// the answer.
func Example() {
	db, store, done := openExampleDB()
	defer done()
	e, err := core.New(store, core.WithSingleCaller())
	if err != nil {
		panic(err)
	}
	mux := http.NewServeMux()
	mux.Handle("POST /orders", e.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := r.Context()
		tx, err := sqlstore.Tx(ctx) // fails (core.ErrNoTx) with a context that is not the request's
		if err != nil {
			http.Error(w, "internal error", http.StatusInternalServerError)
			return
		}
		res, err := tx.ExecContext(ctx, `INSERT INTO orders (item) VALUES (?)`, "tea")
		if err != nil {
			http.Error(w, "could not store the order", http.StatusInternalServerError) // rolls back: nothing happened
			return
		}
		id, _ := res.LastInsertId()
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":%d}`, id)
	})))

	for range 2 {
		req := httptest.NewRequest("POST", "/orders", strings.NewReader(`{"item":"tea"}`))
		req.Header.Set("Idempotency-Key", "8e03978e-40d5-43e8-bc93-6894a57f9324")
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, req)
		fmt.Println(w.Code, w.Body.String(), "replayed:", w.Header().Get("Idempotent-Replayed") == "true")
	}
	var n int
	_ = db.QueryRow(`SELECT COUNT(*) FROM orders`).Scan(&n)
	fmt.Println("orders:", n)
	// Output:
	// 201 {"id":1} replayed: false
	// 201 {"id":1} replayed: true
	// orders: 1
}

// Caller-managed atomic mode: a queue consumer that already holds a
// transaction runs Once inside it with sqlstore.WithTx; the engine neither
// commits nor rolls back, the consumer does.
func Example_withTx() {
	db, store, done := openExampleDB()
	defer done()
	e, err := core.New(store, core.WithSingleCaller())
	if err != nil {
		panic(err)
	}
	consume := func(ctx context.Context, msgID string) error {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer tx.Rollback() // no-op after Commit
		res, err := e.Once(sqlstore.WithTx(ctx, tx), core.Message{Consumer: "orders", ID: msgID},
			func(ctx context.Context) ([]byte, error) {
				_, err := tx.ExecContext(ctx, `INSERT INTO orders (item) VALUES (?)`, "tea") // the consumer's own tx
				return []byte("created"), err
			})
		if err != nil {
			return err
		}
		fmt.Println(string(res.Value), "replayed:", res.Replayed)
		return tx.Commit()
	}
	for range 2 {
		if err := consume(context.Background(), "msg-42"); err != nil {
			fmt.Println("error:", err)
		}
	}
	var n int
	_ = db.QueryRow(`SELECT COUNT(*) FROM orders`).Scan(&n)
	fmt.Println("orders:", n)
	// Output:
	// created replayed: false
	// created replayed: true
	// orders: 1
}

// A service that owns its transaction: its layer begins and commits
// (InTx), and the handler runs through core.Route.Within, which claims the
// key and records the answer in that transaction and writes the answer
// after the commit; a key reused for another order gets the library's 422
// problem document.
func Example_within() {
	db, store, done := openExampleDB()
	defer done()
	e, err := core.New(store, core.WithSingleCaller())
	if err != nil {
		panic(err)
	}
	// The service layer's own transaction helper.
	inTx := func(ctx context.Context, fn func(ctx context.Context) error) error {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer tx.Rollback() // no-op after Commit
		if err := fn(sqlstore.WithTx(ctx, tx)); err != nil {
			return err
		}
		return tx.Commit()
	}
	createOrder := func(w http.ResponseWriter, r *http.Request) {
		ctx := r.Context()
		tx, err := sqlstore.Tx(ctx) // the service's transaction
		if err != nil {
			http.Error(w, "internal error", http.StatusInternalServerError)
			return
		}
		var in struct{ Item string }
		if err := json.NewDecoder(r.Body).Decode(&in); err != nil {
			http.Error(w, "bad order", http.StatusBadRequest)
			return
		}
		res, err := tx.ExecContext(ctx, `INSERT INTO orders (item) VALUES (?)`, in.Item)
		if err != nil {
			http.Error(w, "could not store the order", http.StatusInternalServerError) // rolls back, key released
			return
		}
		id, _ := res.LastInsertId()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":%d}`, id)
	}
	route := e.Route()
	mux := http.NewServeMux()
	mux.HandleFunc("POST /orders", func(w http.ResponseWriter, r *http.Request) {
		route.Within(w, r, inTx, createOrder)
	})

	for _, body := range []string{`{"item":"tea"}`, `{"item":"tea"}`, `{"item":"coffee"}`} {
		req := httptest.NewRequest("POST", "/orders", strings.NewReader(body))
		req.Header.Set("Idempotency-Key", "8e03978e-40d5-43e8-bc93-6894a57f9324")
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, req)
		fmt.Println(w.Code, w.Header().Get("Content-Type"), "replayed:", w.Header().Get("Idempotent-Replayed") == "true")
	}
	var n int
	_ = db.QueryRow(`SELECT COUNT(*) FROM orders`).Scan(&n)
	fmt.Println("orders:", n)
	// Output:
	// 201 application/json replayed: false
	// 201 application/json replayed: true
	// 422 application/problem+json replayed: false
	// orders: 1
}

// Check at start-up: a store created with the wrong dialect, or on a table
// that was never migrated, stops the start with an error naming the fix
// instead of answering 503 at the first request.
func Example_check() {
	db, store, done := openExampleDB()
	defer done()
	ctx := context.Background()
	fmt.Println("migrated:", store.Check(ctx))

	wrong, _ := sqlstore.New(db, sqlstore.Postgres)
	err := wrong.Check(ctx)
	fmt.Println(errors.Is(err, core.ErrConfig), strings.Contains(err.Error(), "use sqlstore.SQLite"))

	other, _ := sqlstore.New(db, sqlstore.SQLite, sqlstore.WithTable("not_migrated"))
	err = other.Check(ctx)
	fmt.Println(errors.Is(err, core.ErrConfig), strings.Contains(err.Error(), "run store.Migrate(ctx)"))
	// Output:
	// migrated: <nil>
	// true true
	// true true
}
