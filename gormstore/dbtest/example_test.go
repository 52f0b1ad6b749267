package dbtest_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"

	"github.com/glebarez/sqlite"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/gormstore"
)

// Order is the example's business row.
type Order struct {
	ID   uint
	Item string
}

// openExampleDB opens GORM on a SQLite file with the settings sqlstore's
// README recommends, with the store's table and an orders table.
func openExampleDB() (*gorm.DB, *gormstore.Store, func()) {
	dir, err := os.MkdirTemp("", "gormstore-example")
	if err != nil {
		panic(err)
	}
	db, err := gorm.Open(sqlite.Open("file:"+filepath.Join(dir, "app.db")+
		"?_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)&_txlock=immediate"), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		panic(err)
	}
	store, err := gormstore.New(db)
	if err != nil {
		panic(err)
	}
	if err := store.Migrate(context.Background()); err != nil {
		panic(err)
	}
	if err := db.AutoMigrate(&Order{}); err != nil {
		panic(err)
	}
	sqlDB, _ := db.DB()
	return db, store, func() { sqlDB.Close(); os.RemoveAll(dir) }
}

// Middleware-managed atomic mode: the engine begins the transaction, the
// handler writes through gormstore.DB(r.Context()), and the order, the key
// and the recorded response commit together before the client gets the
// answer.
func Example() {
	db, store, done := openExampleDB()
	defer done()
	e, err := core.New(store, core.WithSingleCaller())
	if err != nil {
		panic(err)
	}
	mux := http.NewServeMux()
	mux.Handle("POST /orders", e.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		order := Order{Item: "tea"}
		if err := gormstore.DB(r.Context()).Create(&order).Error; err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError) // rolls back: nothing happened
			return
		}
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":%d}`, order.ID)
	})))

	for range 2 {
		req := httptest.NewRequest("POST", "/orders", strings.NewReader(`{"item":"tea"}`))
		req.Header.Set("Idempotency-Key", "8e03978e-40d5-43e8-bc93-6894a57f9324")
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, req)
		fmt.Println(w.Code, w.Body.String(), "replayed:", w.Header().Get("Idempotent-Replayed") == "true")
	}
	var n int64
	db.Model(&Order{}).Count(&n)
	fmt.Println("orders:", n)
	// Output:
	// 201 {"id":1} replayed: false
	// 201 {"id":1} replayed: true
	// orders: 1
}

// Caller-managed atomic mode: code inside db.Transaction runs Once with
// gormstore.WithTx; the record commits or rolls back with the transaction.
func Example_withTx() {
	db, store, done := openExampleDB()
	defer done()
	e, err := core.New(store, core.WithSingleCaller())
	if err != nil {
		panic(err)
	}
	consume := func(ctx context.Context, msgID string) error {
		return db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
			res, err := e.Once(gormstore.WithTx(ctx, tx), core.Message{Consumer: "orders", ID: msgID},
				func(ctx context.Context) ([]byte, error) {
					return []byte("created"), gormstore.DB(ctx).Create(&Order{Item: "tea"}).Error
				})
			if err != nil {
				return err // rolls back the order and the key
			}
			fmt.Println(string(res.Value), "replayed:", res.Replayed)
			return nil
		})
	}
	for range 2 {
		if err := consume(context.Background(), "msg-42"); err != nil {
			fmt.Println("error:", err)
		}
	}
	var n int64
	db.Model(&Order{}).Count(&n)
	fmt.Println("orders:", n)
	// Output:
	// created replayed: false
	// created replayed: true
	// orders: 1
}

// A service that owns its transaction: the handler runs through
// core.Route.Within inside the service's db.Transaction; the key is
// claimed and the answer recorded in that transaction, and the answer is
// written after the commit. A key reused for another order gets the
// library's 422 problem document.
func Example_within() {
	db, store, done := openExampleDB()
	defer done()
	e, err := core.New(store, core.WithSingleCaller())
	if err != nil {
		panic(err)
	}
	inTx := func(ctx context.Context, fn func(ctx context.Context) error) error {
		return db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
			return fn(gormstore.WithTx(ctx, tx))
		})
	}
	createOrder := func(w http.ResponseWriter, r *http.Request) {
		var order Order
		if err := json.NewDecoder(r.Body).Decode(&order); err != nil {
			http.Error(w, "bad order", http.StatusBadRequest)
			return
		}
		if err := gormstore.DB(r.Context()).Create(&order).Error; err != nil {
			http.Error(w, "could not store the order", http.StatusInternalServerError) // rolls back, key released
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":%d}`, order.ID)
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
	var n int64
	db.Model(&Order{}).Count(&n)
	fmt.Println("orders:", n)
	// Output:
	// 201 application/json replayed: false
	// 201 application/json replayed: true
	// 422 application/problem+json replayed: false
	// orders: 1
}

// OrderRepo is an application's repository: it knows nothing of idem and
// writes through its own *gorm.DB with the context it is given.
type OrderRepo struct{ db *gorm.DB }

func (r OrderRepo) Create(ctx context.Context, o *Order) error {
	return r.db.WithContext(ctx).Create(o).Error
}

// With the plugin, the repository's db.WithContext(ctx) runs in the
// request's transaction: the first attempt's order is rolled back with
// its 500, the retry's commits with the key.
func Example_plugin() {
	db, store, done := openExampleDB()
	defer done()
	if err := db.Use(gormstore.Plugin()); err != nil {
		panic(err)
	}
	repo := OrderRepo{db: db}
	e, err := core.New(store, core.WithSingleCaller())
	if err != nil {
		panic(err)
	}
	attempts := 0
	h := e.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		attempts++
		order := Order{Item: "tea"}
		if err := repo.Create(r.Context(), &order); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		if attempts == 1 {
			http.Error(w, "the warehouse did not answer", http.StatusInternalServerError) // rolls the order back
			return
		}
		w.WriteHeader(http.StatusCreated)
	}))

	for range 3 {
		req := httptest.NewRequest("POST", "/orders", strings.NewReader(`{"item":"tea"}`))
		req.Header.Set("Idempotency-Key", "8e03978e-40d5-43e8-bc93-6894a57f9324")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		fmt.Println(w.Code, "replayed:", w.Header().Get("Idempotent-Replayed") == "true")
	}
	var n int64
	db.Model(&Order{}).Count(&n)
	fmt.Println("orders:", n)
	// Output:
	// 500 replayed: false
	// 201 replayed: false
	// 201 replayed: true
	// orders: 1
}
