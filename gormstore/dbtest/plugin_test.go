package dbtest_test

import (
	"context"
	"errors"
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

// TestWritesOutsideTheTransactionFailWithoutThePlugin: without the plugin,
// a repository write with the request's context would run outside the
// request's transaction (Postgres, MySQL: committed on its own, whatever
// the request's outcome; SQLite: waiting for the request's write lock).
// The callback New registers makes it fail at once with ErrOutsideTx
// (never SQLite's "database is locked"), naming the plugin; reads run.
func TestWritesOutsideTheTransactionFailWithoutThePlugin(t *testing.T) {
	for _, tc := range pluginDialects {
		t.Run(tc.name, func(t *testing.T) {
			app := newPluginApp(t, tc.d, false, tc.session)
			var createErr, countErr error
			post := app.serve(t, func(w http.ResponseWriter, r *http.Request) {
				createErr = app.repo.Create(r.Context(), "tea")
				_, countErr = app.repo.Count(r.Context(), "tea")
				w.WriteHeader(http.StatusInternalServerError)
			})
			post("k1")
			if !errors.Is(createErr, gormstore.ErrOutsideTx) || !errors.Is(createErr, core.ErrConfig) {
				t.Fatalf("the repository's write: %v, want ErrOutsideTx (and core.ErrConfig)", createErr)
			}
			if !strings.Contains(createErr.Error(), "db.Use(gormstore.Plugin())") {
				t.Errorf("the error %q does not name the plugin", createErr)
			}
			if countErr != nil {
				t.Errorf("a read outside the transaction: %v, want it to run", countErr)
			}
			if n := app.count(t, "tea"); n != 0 {
				t.Errorf("%d rows, want none", n)
			}
		})
	}
}

// TestPluginOwnTransactions: a transaction the repository opens itself
// with the request's context (db.WithContext(ctx).Transaction) joins the
// request's as a savepoint, on every database, as
// gormstore.DB(ctx).Transaction does (issue 26, item 3: it used to fail with
// ErrOutsideTx, and on SQLite its BEGIN waited for the request's lock).
func TestPluginOwnTransactions(t *testing.T) {
	for _, tc := range pluginDialects {
		t.Run(tc.name, func(t *testing.T) {
			app := newPluginApp(t, tc.d, true, tc.session)
			var ownErr, savepointErr error
			post := app.serve(t, func(w http.ResponseWriter, r *http.Request) {
				ownErr = app.repo.CreateInOwnTx(r.Context(), "own")
				savepointErr = gormstore.DB(r.Context()).Transaction(func(tx *gorm.DB) error {
					return orderRepo{db: tx, table: app.repo.table}.Create(r.Context(), "savepoint")
				})
				w.WriteHeader(http.StatusCreated)
			})
			if status, _, body := post("k1"); status != http.StatusCreated {
				t.Fatalf("%d %q", status, body)
			}
			if ownErr != nil {
				t.Errorf("a write in the repository's own transaction: %v, want it joined", ownErr)
			}
			if n := app.count(t, "own"); n != 1 {
				t.Errorf("%d rows of the repository's own transaction, want 1", n)
			}
			if savepointErr != nil {
				t.Errorf("gormstore.DB(ctx).Transaction: %v", savepointErr)
			}
			if n := app.count(t, "savepoint"); n != 1 {
				t.Errorf("%d rows of the savepoint, want 1", n)
			}
		})
	}
}

// TestPluginWithoutTx: a context from Store.WithoutTx hides the request's
// transaction from the plugin too: a write with it commits on its own (an
// audit row that must survive the request's rollback), neither joined nor
// refused. Not on SQLite: one writer, so such a write waits for the
// request's transaction.
func TestPluginWithoutTx(t *testing.T) {
	for _, tc := range pluginDialects[:2] {
		t.Run(tc.name, func(t *testing.T) {
			app := newPluginApp(t, tc.d, true, tc.session)
			var auditErr error
			post := app.serve(t, func(w http.ResponseWriter, r *http.Request) {
				if err := app.repo.Create(r.Context(), "order"); err != nil {
					http.Error(w, err.Error(), http.StatusInternalServerError)
					return
				}
				auditErr = app.repo.Create(app.store.WithoutTx(r.Context()), "audit")
				w.WriteHeader(http.StatusServiceUnavailable) // rolled back
			})
			post("k1")
			if auditErr != nil {
				t.Fatalf("a write with store.WithoutTx(ctx): %v", auditErr)
			}
			if orders, audits := app.count(t, "order"), app.count(t, "audit"); orders != 0 || audits != 1 {
				t.Errorf("%d order rows and %d audit rows after a 503, want 0 (joined, rolled back) and 1 (outside, committed)", orders, audits)
			}
		})
	}
}

// TestPluginOtherDatabase: the plugin joins only a transaction of the
// statement's own database: a repository on another database (another
// *sql.DB, with the plugin too) writes there as usual with the request's
// context, neither joined nor refused, and its row survives the request's
// rollback.
func TestPluginOtherDatabase(t *testing.T) {
	app := newPluginApp(t, sqlstore.SQLite, true, nil)
	other, _ := openGorm(t, sqlstore.SQLite)
	if err := other.Use(gormstore.Plugin()); err != nil {
		t.Fatal(err)
	}
	if err := other.Table("audit").AutoMigrate(&order{}); err != nil {
		t.Fatal(err)
	}
	audit := orderRepo{db: other, table: "audit"}
	var auditErr error
	post := app.serve(t, func(w http.ResponseWriter, r *http.Request) {
		if err := app.repo.Create(r.Context(), "order"); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		auditErr = audit.Create(r.Context(), "audit")
		w.WriteHeader(http.StatusInternalServerError) // rolled back
	})
	post("k1")
	if auditErr != nil {
		t.Fatalf("a write on the other database: %v", auditErr)
	}
	if n := app.count(t, "order"); n != 0 {
		t.Errorf("%d order rows after a 500, want 0", n)
	}
	if n, err := audit.Count(context.Background(), "audit"); err != nil || n != 1 {
		t.Errorf("%d rows on the other database (%v), want 1", n, err)
	}
}

// TestPluginCallerManaged: in caller-managed mode (gormstore.WithTx inside
// db.Transaction), the repository joins the caller's transaction through
// the plugin: a run whose unit fails rolls its row back with the key, the
// next commits both.
func TestPluginCallerManaged(t *testing.T) {
	for _, tc := range pluginDialects {
		t.Run(tc.name, func(t *testing.T) {
			app := newPluginApp(t, tc.d, true, tc.session)
			e, err := core.New(app.store, core.WithSingleCaller(), core.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			msg := core.Message{Consumer: "orders", ID: "m1"}
			for i, fail := range []bool{true, false, false} {
				var res core.Result
				err := app.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
					var err error
					res, err = e.Once(gormstore.WithTx(ctx, tx), msg, func(ctx context.Context) ([]byte, error) {
						if err := app.repo.Create(ctx, "tea"); err != nil {
							return nil, err
						}
						if fail {
							return nil, errors.New("the unit failed after its write")
						}
						return []byte("done"), nil
					})
					return err
				})
				if fail != (err != nil) || !fail && (string(res.Value) != "done" || res.Replayed != (i == 2)) {
					t.Fatalf("run %d: %v %q replayed=%v", i+1, err, res.Value, res.Replayed)
				}
			}
			if n := app.count(t, "tea"); n != 1 {
				t.Errorf("%d rows, want 1", n)
			}
		})
	}
}

// TestPluginLeasedRoute: a Leased route has no transaction of idem's: the
// repository writes on the pool as it would without idem, neither joined
// nor refused.
func TestPluginLeasedRoute(t *testing.T) {
	app := newPluginApp(t, sqlstore.SQLite, true, nil)
	var createErr error
	post := app.serve(t, func(w http.ResponseWriter, r *http.Request) {
		createErr = app.repo.Create(r.Context(), "tea")
		w.WriteHeader(http.StatusCreated)
	}, core.Leased())
	post("k1")
	if createErr != nil || app.count(t, "tea") != 1 {
		t.Fatalf("the write of a Leased route: %v, %d rows; want it committed", createErr, app.count(t, "tea"))
	}
}

// TestPluginDedicatedConnection: a statement on a connection of its own
// (db.WithContext(ctx).Connection(func(tx *gorm.DB) error {...}), as code
// that sets session variables does) with the request's context runs
// outside the request's transaction as surely as one on the pool: with the
// plugin it joins the transaction (a 500 leaves no row); without it, the
// write fails with ErrOutsideTx (never committed on its own, never
// waiting for SQLite's lock).
func TestPluginDedicatedConnection(t *testing.T) {
	for _, tc := range pluginDialects {
		for _, plugin := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/Plugin=%v", tc.name, plugin), func(t *testing.T) {
				app := newPluginApp(t, tc.d, plugin, tc.session)
				var connErr error
				post := app.serve(t, func(w http.ResponseWriter, r *http.Request) {
					connErr = app.repo.db.WithContext(r.Context()).Connection(func(conn *gorm.DB) error {
						return orderRepo{db: conn, table: app.repo.table}.Create(r.Context(), "conn")
					})
					w.WriteHeader(http.StatusInternalServerError) // rolled back
				})
				post("k1")
				if plugin && connErr != nil {
					t.Errorf("a write on a connection of its own, with the plugin: %v, want it joined", connErr)
				}
				if !plugin && !errors.Is(connErr, gormstore.ErrOutsideTx) {
					t.Errorf("a write on a connection of its own, without the plugin: %v, want ErrOutsideTx", connErr)
				}
				if n := app.count(t, "conn"); n != 0 {
					t.Errorf("%d rows written on a connection of its own after a 500, want 0", n)
				}
			})
		}
	}
}

// TestRawWritesOutsideTheTransaction: a write sent as raw SQL that returns
// rows (db.WithContext(ctx).Raw("INSERT ... RETURNING id").Scan(&id), GORM's
// way to read what an insert returns) is a write like Create: without the
// plugin it fails with ErrOutsideTx instead of committing on its own
// (Postgres, MySQL) or waiting for SQLite's lock, and with the plugin it
// joins the request's transaction. A raw SELECT still runs without the
// plugin.
func TestRawWritesOutsideTheTransaction(t *testing.T) {
	for _, tc := range pluginDialects {
		for _, plugin := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/Plugin=%v", tc.name, plugin), func(t *testing.T) {
				app := newPluginApp(t, tc.d, plugin, tc.session)
				var insertErr, selectErr error
				post := app.serve(t, func(w http.ResponseWriter, r *http.Request) {
					db := app.repo.db.WithContext(r.Context())
					var id int64
					insertErr = db.Raw("\n  insert\nINTO "+app.repo.table+" (name) VALUES (?) RETURNING id", "raw").Scan(&id).Error
					var n int64
					selectErr = db.Raw("SELECT COUNT(*) FROM " + app.repo.table).Scan(&n).Error
					w.WriteHeader(http.StatusInternalServerError) // rolled back
				})
				post("k1")
				if plugin && insertErr != nil {
					t.Errorf("Raw(INSERT ... RETURNING).Scan with the plugin: %v, want it joined", insertErr)
				}
				if !plugin && !errors.Is(insertErr, gormstore.ErrOutsideTx) {
					t.Errorf("Raw(INSERT ... RETURNING).Scan without the plugin: %v, want ErrOutsideTx", insertErr)
				}
				if selectErr != nil {
					t.Errorf("Raw(SELECT).Scan: %v, want it to run", selectErr)
				}
				if n := app.count(t, "raw"); n != 0 {
					t.Errorf("%d rows of a raw insert after a 500, want 0", n)
				}
			})
		}
	}
}

// TestWritesAfterTheTransaction: work a handler leaves for after its
// response (go audit(context.WithoutCancel(r.Context()))) runs once the
// request's transaction has committed or rolled back. Its writes can join
// nothing any more: they run on the pool as without idem, with or without
// the plugin (not refused with ErrOutsideTx, not sent to the finished
// transaction).
func TestWritesAfterTheTransaction(t *testing.T) {
	for _, tc := range pluginDialects {
		for _, plugin := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/Plugin=%v", tc.name, plugin), func(t *testing.T) {
				app := newPluginApp(t, tc.d, plugin, tc.session)
				var later []context.Context
				post := app.serve(t, func(w http.ResponseWriter, r *http.Request) {
					later = append(later, context.WithoutCancel(r.Context()))
					if len(later) == 1 {
						w.WriteHeader(http.StatusInternalServerError) // rolled back
						return
					}
					w.WriteHeader(http.StatusCreated) // committed
				})
				post("k1")
				post("k1")
				for i, ctx := range later {
					if err := app.repo.Create(ctx, "later"); err != nil {
						t.Errorf("a write after the transaction of attempt %d ended: %v, want it committed on its own", i+1, err)
					}
				}
				if n := app.count(t, "later"); n != 2 {
					t.Errorf("%d rows written after the transactions ended, want 2", n)
				}
			})
		}
	}
}
