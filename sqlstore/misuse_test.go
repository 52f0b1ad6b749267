package sqlstore_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/sqlstore"
)

// TestTxWithoutTransactionFailsLoudly: sqlstore.Tx with a context that
// carries no transaction (not the request's, or a Leased route's) returns
// an error wrapping core.ErrNoTx that names the fix; in an atomic route it
// returns the request's transaction.
func TestTxWithoutTransactionFailsLoudly(t *testing.T) {
	wantNoTx := func(t *testing.T, what string, err error, hint string) {
		t.Helper()
		if !errors.Is(err, core.ErrNoTx) {
			t.Fatalf("%s: error %v, want core.ErrNoTx", what, err)
		}
		if !strings.Contains(err.Error(), hint) {
			t.Errorf("%s: error %q does not say %q", what, err, hint)
		}
	}
	t.Run("NotTheRequestsContext", func(t *testing.T) {
		tx, err := sqlstore.Tx(context.Background())
		if tx != nil {
			t.Error("a transaction from a context without one")
		}
		wantNoTx(t, "Tx(ctx)", err, "c.Request.Context()")
	})

	s, _, _ := newStore(t, sqlstore.SQLite)
	e, err := core.New(s, core.WithSingleCaller(), core.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
	if err != nil {
		t.Fatal(err)
	}
	var leasedErr, atomicErr error
	leased := e.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, leasedErr = sqlstore.Tx(r.Context())
	}), core.Scope("leased"), core.Leased())
	atomic := e.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tx, err := sqlstore.Tx(r.Context())
		if err == nil {
			_, err = tx.ExecContext(r.Context(), "SELECT 1")
		}
		atomicErr = err
	}), core.Scope("atomic"))
	send := func(h http.Handler) {
		r := httptest.NewRequest("POST", "/", nil)
		r.Header.Set(core.HeaderKey, "k1")
		h.ServeHTTP(httptest.NewRecorder(), r)
	}
	t.Run("LeasedRoute", func(t *testing.T) {
		send(leased)
		wantNoTx(t, "a Leased route", leasedErr, "this route is Leased: idem holds no transaction for it; use your own *sql.DB")
	})
	t.Run("AtomicRoute", func(t *testing.T) {
		send(atomic)
		if atomicErr != nil {
			t.Fatalf("Tx in an atomic route: %v", atomicErr)
		}
	})
}
