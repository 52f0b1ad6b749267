package main

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/admin"
	"github.com/idemkit/idem/core/store"
	"github.com/idemkit/idem/sqlstore"
	"github.com/idemkit/idem/sqlstore/sqlstoretest"
)

// database is one database the tests run idemctl on: the DSN idemctl is
// given, and how the application under test opens it.
type database struct {
	name   string
	dsn    string // what the operator passes to -dsn
	driver string
	appDSN string // what the application opens
}

// databases are the test databases: Postgres and MySQL/MariaDB from the
// environment (env; a missing one skips its subtest, or fails it under CI
// or IDEM_REQUIRE_DB), and an SQLite file of the test's own (env empty).
var databases = []struct {
	name, env, driver string
	dialect           sqlstore.Dialect
}{
	{"postgres", sqlstoretest.EnvPostgres, "pgx", sqlstore.Postgres},
	{"mysql", sqlstoretest.EnvMySQL, "mysql", sqlstore.MySQL},
	{"sqlite", "", "sqlite", sqlstore.SQLite},
}

// app is the application whose records idemctl works on: a payment route
// (leased: the charge is an external effect) on its own engine over a
// table of its own in db.
type app struct {
	mux    http.Handler
	ran    atomic.Int32
	answer atomic.Int32
	block  chan struct{} // when not nil, the handler waits for it
	inside chan struct{} // the handler has marked the charge
}

func newApp(t *testing.T, store store.Store, opts ...core.Option) *app {
	t.Helper()
	e, err := core.New(store, append([]core.Option{core.WithSingleCaller(), core.WithLogger(quietLogger)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	a := &app{inside: make(chan struct{}, 4)}
	a.answer.Store(http.StatusBadGateway)
	mux := http.NewServeMux()
	mux.Handle("POST /payments", e.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		a.ran.Add(1)
		if err := core.MarkEffect(r.Context()); err != nil {
			t.Error(err)
		}
		a.inside <- struct{}{}
		if a.block != nil {
			<-a.block
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(int(a.answer.Load()))
		_, _ = w.Write([]byte(`{"charge":"ch_1"}`))
	}), core.Leased()))
	a.mux = mux
	return a
}

func (a *app) pay(key string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(http.MethodPost, "/payments", strings.NewReader(`{"amount":100}`))
	r.Header.Set("Content-Type", "application/json")
	r.Header.Set(core.HeaderKey, key)
	w := httptest.NewRecorder()
	a.mux.ServeHTTP(w, r)
	return w
}

var quietLogger = slog.New(slog.DiscardHandler)

// idemctl runs the command's main logic with args and returns its exit
// status and output.
func idemctl(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	code = run(context.Background(), args, &out, &errb, func(string) string { return "" })
	return code, out.String(), errb.String()
}

// TestEndToEnd: an application leaves a payment indeterminate (the
// provider timed out after the charge was marked) and another in progress
// (its replica stopped extending the lease: its clock, and so its
// heartbeat, an hour behind), and completes a third. idemctl, on the same
// DSN, lists them by state, shows one, resolves the indeterminate one as
// applied (the retry then gets the operator's answer) and releases the
// stuck one (its old attempt, still alive, is fenced; the retry runs the
// handler), and refuses what it must.
func TestEndToEnd(t *testing.T) {
	for _, db := range databases {
		t.Run(db.name, func(t *testing.T) {
			var dsn, appDSN string
			if db.env != "" {
				dsn = sqlstoretest.DSN(t, db.env)
				appDSN = dsn
			} else {
				file := filepath.Join(t.TempDir(), "app.db")
				dsn = "file:" + file
				appDSN = dsn + "?_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)&_txlock=immediate"
			}
			sdb, err := sql.Open(db.driver, appDSN)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { sdb.Close() })
			table := sqlstoretest.Table()
			st, err := sqlstore.New(sdb, db.dialect, sqlstore.WithTable(table))
			if err != nil {
				t.Fatal(err)
			}
			if err := st.Migrate(context.Background()); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _, _ = sdb.Exec("DROP TABLE IF EXISTS " + table) })
			common := []string{"-dsn", dsn, "-table", table}
			cmd := func(args ...string) (int, string, string) {
				t.Helper()
				return idemctl(t, append(args, common...)...)
			}

			pay := newApp(t, st)
			if w := pay.pay("pay-indeterminate"); w.Code != http.StatusBadGateway {
				t.Fatalf("seeding the indeterminate payment: %d %s", w.Code, w.Body)
			}
			pay.answer.Store(http.StatusCreated)
			if w := pay.pay("pay-done"); w.Code != http.StatusCreated {
				t.Fatalf("seeding the completed payment: %d", w.Code)
			}
			stuck := newApp(t, st, core.WithClock(func() time.Time { return time.Now().Add(-time.Hour) }))
			stuck.answer.Store(http.StatusCreated)
			stuck.block = make(chan struct{})
			zombie := make(chan *httptest.ResponseRecorder, 1)
			go func() { zombie <- stuck.pay("pay-stuck") }()
			<-stuck.inside
			var unblock sync.Once
			defer unblock.Do(func() { close(stuck.block); <-zombie })

			// list: the indeterminate one, in text and in JSON.
			code, out, errs := cmd("list")
			if code != 0 || !strings.Contains(out, "indeterminate") || !strings.Contains(out, "pay-indeterminate") || !strings.Contains(out, "502") {
				t.Fatalf("list: %d\n%s%s", code, out, errs)
			}
			var page admin.Page
			code, out, errs = cmd("list", "-json")
			if code != 0 || json.Unmarshal([]byte(out), &page) != nil || len(page.Records) != 1 {
				t.Fatalf("list -json: %d\n%s%s", code, out, errs)
			}
			indeterminate := page.Records[0]
			if indeterminate.Key != "pay-indeterminate" || indeterminate.Status != 502 || !strings.Contains(indeterminate.Why, "outcome unknown") {
				t.Fatalf("list -json: %+v", indeterminate)
			}
			code, out, errs = cmd("list", "-state", "in_progress", "-older", "30m", "-json")
			if code != 0 || json.Unmarshal([]byte(out), &page) != nil || len(page.Records) != 1 || !page.Records[0].LeaseLapsed || page.Records[0].Key != "pay-stuck" {
				t.Fatalf("list -state in_progress -older 30m: %d\n%s%s", code, out, errs)
			}
			stuckID := page.Records[0].ID
			code, out, errs = cmd("list", "-state", "in_progress", "-older", "2h")
			if code != 0 || !strings.Contains(out, "no in_progress records older than 2h0m0s") {
				t.Fatalf("list -older 2h: %d\n%s%s", code, out, errs)
			}
			code, out, errs = cmd("list", "-state", "completed", "-limit", "1")
			if code != 0 || !strings.Contains(out, "pay-done") || !strings.Contains(out, "more: idemctl list -state completed -limit 1 -after ") {
				t.Fatalf("list -state completed -limit 1: %d\n%s%s", code, out, errs)
			}

			// show: the record with why and its recorded answer; flags after the id.
			code, out, errs = cmd("show", indeterminate.ID)
			if code != 0 || !strings.Contains(out, "why:") || !strings.Contains(out, `{"charge":"ch_1"}`) || !regexp.MustCompile(`response:\s+502`).MatchString(out) {
				t.Fatalf("show: %d\n%s%s", code, out, errs)
			}

			// resolve as applied: the retry gets the operator's answer.
			code, out, errs = cmd("resolve", indeterminate.ID, "-outcome", "applied", "-status", "201",
				"-body", `{"payment":"pay_42"}`, "-reason", "provider shows ch_1 captured (OPS-7)")
			if code != 0 || !strings.Contains(out, "resolved as applied") {
				t.Fatalf("resolve: %d\n%s%s", code, out, errs)
			}
			if !strings.Contains(errs, "operator action") || !strings.Contains(errs, "id="+indeterminate.ID) || !strings.Contains(errs, `reason="provider shows ch_1 captured (OPS-7)"`) {
				t.Fatalf("resolve did not log the action with the id and the reason:\n%s", errs)
			}
			if w := pay.pay("pay-indeterminate"); w.Code != 201 || w.Body.String() != `{"payment":"pay_42"}` || w.Header().Get("Content-Type") != "application/json" {
				t.Fatalf("retry after resolve: %d %s %v", w.Code, w.Body, w.Header())
			}
			// A completed record is final.
			if code, _, errs = cmd("release", indeterminate.ID, "-reason", "again"); code != 1 || !strings.Contains(errs, "final") {
				t.Fatalf("release of a completed record: %d %s", code, errs)
			}

			// release the stuck one: the old attempt is fenced, the retry runs.
			if code, out, errs = cmd("release", stuckID, "-reason", "provider has no charge for the downstream key", "-json"); code != 0 || !strings.Contains(out, `"state": "absent"`) {
				t.Fatalf("release: %d\n%s%s", code, out, errs)
			}
			unblock.Do(func() {
				close(stuck.block)
				if w := <-zombie; w.Code != http.StatusConflict {
					t.Errorf("the old attempt after the release: %d %s, want 409 (lease lost)", w.Code, w.Body)
				}
			})
			before := pay.ran.Load()
			if w := pay.pay("pay-stuck"); w.Code != 201 || pay.ran.Load() != before+1 {
				t.Fatalf("retry after release: %d, handler ran %d times (before %d)", w.Code, pay.ran.Load(), before)
			}

			// Refusals.
			missing := store.Identity{Key: "never"}.ID().String()
			for _, tc := range []struct {
				args []string
				code int
				want string
			}{
				{[]string{"show", missing}, 1, "no live record"},
				{[]string{"show", "xyz"}, 2, "record id"},
				{[]string{"resolve", missing, "-outcome", "maybe", "-reason", "r"}, 2, "-outcome applied or -outcome not_applied"},
				{[]string{"resolve", missing, "-outcome", "applied", "-reason", "r"}, 2, "-status"},
				{[]string{"release", missing}, 2, "-reason is required"},
				{[]string{"list", "-state", "stuck"}, 2, "unknown state"},
				{[]string{"frobnicate"}, 2, "unknown command"},
			} {
				code, out, errs := cmd(tc.args...)
				if code != tc.code || !strings.Contains(errs, tc.want) {
					t.Errorf("idemctl %v: %d, stderr %q, stdout %q; want %d and %q", tc.args, code, errs, out, tc.code, tc.want)
				}
			}
		})
	}
}

// The database is told by the DSN, or by -db.
func TestParseDSN(t *testing.T) {
	for _, tc := range []struct {
		db, dsn string
		want    sqlstore.Dialect
		driver  string
	}{
		{"", "postgres://u:p@localhost:5432/app?sslmode=disable", sqlstore.Postgres, "pgx"},
		{"", "postgresql://localhost/app", sqlstore.Postgres, "pgx"},
		{"", "u:p@tcp(localhost:3306)/app?parseTime=true", sqlstore.MySQL, "mysql"},
		{"", "mysql://u:p@tcp(localhost:3306)/app", sqlstore.MySQL, "mysql"},
		{"", "file:/var/lib/app/idem.db?_pragma=journal_mode(WAL)", sqlstore.SQLite, "sqlite"},
		{"", "/var/lib/app/idem.sqlite", sqlstore.SQLite, "sqlite"},
		{"postgres", "host=localhost dbname=app", sqlstore.Postgres, "pgx"},
		{"sqlite", "app-data", sqlstore.SQLite, "sqlite"},
	} {
		d, driver, out, err := parseDSN(tc.db, tc.dsn)
		if err != nil || d != tc.want || driver != tc.driver {
			t.Errorf("parseDSN(%q, %q) = %v, %q, %q, %v; want %v, %q", tc.db, tc.dsn, d, driver, out, err, tc.want, tc.driver)
		}
		if d == sqlstore.SQLite && !strings.Contains(out, "busy_timeout") {
			t.Errorf("parseDSN(%q): %q has no busy_timeout", tc.dsn, out)
		}
		if d == sqlstore.MySQL && !strings.Contains(out, "parseTime=true") {
			t.Errorf("parseDSN(%q): %q has no parseTime", tc.dsn, out)
		}
	}
	for _, dsn := range []string{"host=db password=s3cret", "u:s3cret@db/app", "pg://u:s3cret@db/app"} {
		if _, _, _, err := parseDSN("", dsn); err == nil || strings.Contains(err.Error(), "s3cret") || !strings.Contains(err.Error(), "-db") {
			t.Errorf("parseDSN(%q): %v, want an error asking for -db, without the password", dsn, err)
		}
	}
}
