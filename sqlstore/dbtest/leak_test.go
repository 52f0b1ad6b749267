package dbtest_test

import (
	"bytes"
	"database/sql"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/sqlstore"
)

// TestUnreachableDatabaseDoesNotLeak: a pool pointed at a closed port
// (127.0.0.1:1) makes every claim fail with the driver's own text, which
// names the user, the database and the host. The client gets a 503 whose
// body and headers carry none of it; the log has it, with the record_id
// of the problem.
func TestUnreachableDatabaseDoesNotLeak(t *testing.T) {
	for _, c := range []struct {
		dialect sqlstore.Dialect
		driver  string
		dsn     string
	}{
		{sqlstore.Postgres, "pgx", "postgres://billing_rw:hunter2@127.0.0.1:1/payments_prod?connect_timeout=2"},
		{sqlstore.MySQL, "mysql", "billing_rw:hunter2@tcp(127.0.0.1:1)/payments_prod?timeout=2s&parseTime=true"},
	} {
		t.Run(c.dialect.String(), func(t *testing.T) {
			db, err := sql.Open(c.driver, c.dsn)
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			st, err := sqlstore.New(db, c.dialect)
			if err != nil {
				t.Fatal(err)
			}
			var logs bytes.Buffer
			for _, leased := range []bool{false, true} {
				e, err := core.New(st, core.WithSingleCaller(), core.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
				if err != nil {
					t.Fatal(err)
				}
				var opts []core.RouteOption
				if leased {
					opts = append(opts, core.Leased())
				}
				ran := false
				h := e.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { ran = true }), append(opts, core.Scope("pay"))...)
				req := httptest.NewRequest("POST", "/pay", strings.NewReader(`{}`))
				req.Header.Set(core.HeaderKey, "k1")
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, req)
				body, _ := io.ReadAll(rec.Result().Body)
				if rec.Code != http.StatusServiceUnavailable || ran {
					t.Fatalf("leased=%v: status %d (handler ran: %v), want 503 without running: %s", leased, rec.Code, ran, body)
				}
				for _, m := range []string{"billing_rw", "payments_prod", "127.0.0.1", "hunter2", "dial", "refused"} {
					if bytes.Contains(body, []byte(m)) {
						t.Errorf("leased=%v: the body carries %q: %s", leased, m, body)
					}
					for name, vs := range rec.Header() {
						if strings.Contains(strings.Join(vs, " "), m) {
							t.Errorf("leased=%v: header %s carries %q", leased, name, m)
						}
					}
				}
				var p struct {
					RecordID string `json:"record_id"`
				}
				if err := json.Unmarshal(body, &p); err != nil || p.RecordID == "" {
					t.Fatalf("leased=%v: no record_id in the problem: %s", leased, body)
				}
				found := false
				for _, line := range strings.Split(logs.String(), "\n") {
					found = found || strings.Contains(line, "id="+p.RecordID) && strings.Contains(line, "127.0.0.1:1")
				}
				if !found {
					t.Errorf("leased=%v: no log line has the driver's error and id=%s: %s", leased, p.RecordID, logs.String())
				}
			}
		})
	}
}
