package dbtest_test

import (
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"gorm.io/driver/mysql"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/gormstore"
)

// TestUnreachableDatabaseDoesNotLeak: GORM on a closed port (127.0.0.1:1)
// fails every claim with the driver's text (user, database, host); the
// client gets a 503 without any of it, and the log has it under the
// problem's record_id.
func TestUnreachableDatabaseDoesNotLeak(t *testing.T) {
	for name, d := range map[string]gorm.Dialector{
		"postgres": postgres.Open("postgres://billing_rw:hunter2@127.0.0.1:1/payments_prod?connect_timeout=2"),
		"mysql":    mysql.New(mysql.Config{DSN: "billing_rw:hunter2@tcp(127.0.0.1:1)/payments_prod?timeout=2s&parseTime=true", SkipInitializeWithVersion: true}),
	} {
		t.Run(name, func(t *testing.T) {
			db, err := gorm.Open(d, &gorm.Config{DisableAutomaticPing: true, Logger: logger.Discard})
			if err != nil {
				t.Fatal(err)
			}
			if sqlDB, err := db.DB(); err == nil {
				defer sqlDB.Close()
			}
			st, err := gormstore.New(db)
			if err != nil {
				t.Fatal(err)
			}
			var logs bytes.Buffer
			e, err := core.New(st, core.WithSingleCaller(), core.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
			if err != nil {
				t.Fatal(err)
			}
			h := e.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { t.Error("the handler ran") }), core.Scope("pay"))
			req := httptest.NewRequest("POST", "/pay", strings.NewReader(`{}`))
			req.Header.Set(core.HeaderKey, "k1")
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			body, _ := io.ReadAll(rec.Result().Body)
			if rec.Code != http.StatusServiceUnavailable {
				t.Fatalf("status %d, want 503: %s", rec.Code, body)
			}
			for _, m := range []string{"billing_rw", "payments_prod", "127.0.0.1", "hunter2", "dial", "refused"} {
				if bytes.Contains(body, []byte(m)) {
					t.Errorf("the body carries %q: %s", m, body)
				}
				for name, vs := range rec.Header() {
					if strings.Contains(strings.Join(vs, " "), m) {
						t.Errorf("header %s carries %q", name, m)
					}
				}
			}
			var p struct {
				RecordID string `json:"record_id"`
			}
			if err := json.Unmarshal(body, &p); err != nil || p.RecordID == "" {
				t.Fatalf("no record_id in the problem: %s", body)
			}
			found := false
			for _, line := range strings.Split(logs.String(), "\n") {
				found = found || strings.Contains(line, "id="+p.RecordID) && strings.Contains(line, "127.0.0.1:1")
			}
			if !found {
				t.Errorf("no log line has the driver's error and id=%s: %s", p.RecordID, logs.String())
			}
		})
	}
}
