package gormstore_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"gorm.io/gorm"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/gormstore"
	"github.com/idemkit/idem/sqlstore"
)

// orderRepo is an application's repository that knows nothing of idem: it
// writes and reads through its own *gorm.DB with the context it is given,
// as repositories do.
type orderRepo struct {
	db    *gorm.DB
	table string
}

func (r orderRepo) Create(ctx context.Context, name string) error {
	return r.db.WithContext(ctx).Table(r.table).Create(&order{Name: name}).Error
}

func (r orderRepo) Count(ctx context.Context, name string) (int64, error) {
	var n int64
	err := r.db.WithContext(ctx).Table(r.table).Where("name = ?", name).Count(&n).Error
	return n, err
}

// CreateInOwnTx writes in a transaction the repository opens itself.
func (r orderRepo) CreateInOwnTx(ctx context.Context, name string) error {
	return r.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		return tx.Table(r.table).Create(&order{Name: name}).Error
	})
}

// pluginApp is a store on a fresh table of d, an orders table, and the
// application's repository on the same *gorm.DB (session, when not nil,
// derives the repository's *gorm.DB, as an application's own settings
// would).
type pluginApp struct {
	store *gormstore.Store
	db    *gorm.DB
	repo  orderRepo
}

func newPluginApp(t *testing.T, d sqlstore.Dialect, plugin bool, session func(*gorm.DB) *gorm.DB) pluginApp {
	t.Helper()
	s, db, _ := newStore(t, d)
	if plugin {
		if err := db.Use(gormstore.Plugin()); err != nil {
			t.Fatal(err)
		}
	}
	orders := s.Table() + "_orders"
	if err := db.Table(orders).AutoMigrate(&order{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Migrator().DropTable(orders) })
	repoDB := db
	if session != nil {
		repoDB = session(db)
	}
	return pluginApp{store: s, db: db, repo: orderRepo{db: repoDB, table: orders}}
}

// count reads the committed rows named name, outside any transaction.
func (a pluginApp) count(t *testing.T, name string) int64 {
	t.Helper()
	n, err := a.repo.Count(context.Background(), name)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// serve runs handler behind the engine's middleware (atomic unless opts
// say otherwise) on a real HTTP server, and returns a function that POSTs
// one request with key and the status and replay flag it got.
func (a pluginApp) serve(t *testing.T, handler http.HandlerFunc, opts ...core.RouteOption) func(key string) (int, bool, string) {
	t.Helper()
	e, err := core.New(a.store, core.WithSingleCaller(), core.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(e.Handler(handler, opts...))
	t.Cleanup(srv.Close)
	client := &http.Client{Timeout: 30 * time.Second} // a failsafe: SQLite's lock wait is 5 s
	return func(key string) (int, bool, string) {
		t.Helper()
		req, err := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader(`{"item":"tea"}`))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set(core.HeaderKey, key)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header.Get(core.HeaderReplayed) == "true", string(body)
	}
}

var pluginDialects = []struct {
	name    string
	d       sqlstore.Dialect
	session func(*gorm.DB) *gorm.DB
}{
	{"Postgres", sqlstore.Postgres, nil},
	{"MySQL", sqlstore.MySQL, nil},
	{"SQLite", sqlstore.SQLite, nil},
	{"SQLitePrepareStmt", sqlstore.SQLite, func(db *gorm.DB) *gorm.DB { return db.Session(&gorm.Session{PrepareStmt: true}) }},
}

// TestPluginJoinsTheRequestTransaction: with db.Use(gormstore.Plugin()),
// a repository that writes through its own *gorm.DB with the request's
// context (db.WithContext(ctx).Create) runs in the request's transaction:
// a handler that fails twice with 500 after the write and then succeeds
// leaves exactly one row, and its reads see its own writes. Without the
// plugin, Postgres and MySQL commit a row per attempt (three) and SQLite
// waits for the transaction's write lock until busy_timeout.
func TestPluginJoinsTheRequestTransaction(t *testing.T) {
	for _, tc := range pluginDialects {
		t.Run(tc.name, func(t *testing.T) {
			app := newPluginApp(t, tc.d, true, tc.session)
			var runs atomic.Int64
			post := app.serve(t, func(w http.ResponseWriter, r *http.Request) {
				n := runs.Add(1)
				if err := app.repo.Create(r.Context(), "tea"); err != nil {
					http.Error(w, "create: "+err.Error(), http.StatusInternalServerError)
					return
				}
				seen, err := app.repo.Count(r.Context(), "tea")
				if err != nil {
					http.Error(w, "count: "+err.Error(), http.StatusInternalServerError)
					return
				}
				if n <= 2 {
					http.Error(w, "the payment provider is down", http.StatusInternalServerError)
					return
				}
				w.WriteHeader(http.StatusCreated)
				fmt.Fprintf(w, "seen %d", seen)
			})
			for i, want := range []struct {
				status   int
				replayed bool
				body     string
			}{
				{500, false, "the payment provider is down\n"},
				{500, false, "the payment provider is down\n"},
				{201, false, "seen 1"},
				{201, true, "seen 1"},
			} {
				status, replayed, body := post("k1")
				if status != want.status || replayed != want.replayed || body != want.body {
					t.Fatalf("request %d: %d replayed=%v %q, want %d replayed=%v %q", i+1, status, replayed, body, want.status, want.replayed, want.body)
				}
			}
			if n := app.count(t, "tea"); n != 1 {
				t.Errorf("%d rows after two 500s and a 201, want exactly 1 (the rolled-back attempts' rows must be gone)", n)
			}
			if n := runs.Load(); n != 3 {
				t.Errorf("the handler ran %d times, want 3", n)
			}
		})
	}
}
