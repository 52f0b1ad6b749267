package dbtest_test

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem/core"
)

// TestPluginJoinsAfterAClaimOfAnExpiredRecord: a claim in Begin's
// transaction that meets an expired record may roll that transaction back
// and begin it again before it claims (sqlstore: MariaDB after the
// INSERT's duplicate key, Postgres after a serialization failure, MariaDB
// after a deadlock). The transaction the handler then runs in is the new
// one, and the repository's writes through the plugin must join it: a
// handler that writes and then fails with 500 leaves no row. Found in
// review of claimcost: gormTx.Rollback marks the deferred transaction
// ended, so the plugin (liveTx) no longer sees the new one and the write
// autocommits on the pool, outside the request's transaction (the retry
// runs the handler again: the effect twice).
func TestPluginJoinsAfterAClaimOfAnExpiredRecord(t *testing.T) {
	for _, tc := range pluginDialects {
		t.Run(tc.name, func(t *testing.T) {
			app := newPluginApp(t, tc.d, true, tc.session)
			var (
				mu  sync.Mutex
				now = time.Now()
			)
			clock := func() time.Time {
				mu.Lock()
				defer mu.Unlock()
				return now
			}
			e, err := core.New(app.store, core.WithSingleCaller(), core.WithClock(clock), core.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
			if err != nil {
				t.Fatal(err)
			}
			var fail bool
			srv := httptest.NewServer(e.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				name := "tea1"
				if fail {
					name = "tea2"
				}
				if err := app.repo.Create(r.Context(), name); err != nil {
					http.Error(w, "create: "+err.Error(), http.StatusInternalServerError)
					return
				}
				if fail {
					http.Error(w, "the payment provider is down", http.StatusInternalServerError)
					return
				}
				w.WriteHeader(http.StatusCreated)
			}), core.Retention(time.Minute)))
			t.Cleanup(srv.Close)
			post := func() int {
				t.Helper()
				req, err := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader(`{"item":"tea"}`))
				if err != nil {
					t.Fatal(err)
				}
				req.Header.Set(core.HeaderKey, "k1")
				resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
				if err != nil {
					t.Fatal(err)
				}
				defer resp.Body.Close()
				_, _ = io.ReadAll(resp.Body)
				return resp.StatusCode
			}
			if status := post(); status != http.StatusCreated {
				t.Fatalf("first request: %d, want 201", status)
			}
			// The record expires (not swept): the same key is a new request,
			// whose claim replaces the expired row.
			mu.Lock()
			now = now.Add(2 * time.Minute)
			mu.Unlock()
			fail = true
			if status := post(); status != http.StatusInternalServerError {
				t.Fatalf("request after expiry: %d, want 500", status)
			}
			if n := app.count(t, "tea2"); n != 0 {
				t.Errorf("%d rows of the attempt that failed with 500 after its write, want 0: the repository's write ran outside the request's transaction", n)
			}
		})
	}
}
