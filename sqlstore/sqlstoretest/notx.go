package sqlstoretest

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
	"github.com/idemkit/idem/core/store"
)

// RunTxAccess checks a store's accessor of the request's transaction
// (sqlstore.Tx, gormstore.DB): use runs one statement through the
// accessor with the context it is given. Without a transaction in the
// context (not the request's context: NotTheRequestsContext) use must
// fail with an error wrapping core.ErrNoTx whose text contains
// notRequestHint, the fix. In an atomic route on s (AtomicRoute) it must
// succeed, and in a Leased route too (LeasedRoute): the leased attempt's
// own transaction, whose writes commit with its completion. check, when
// not nil, runs after both requests, to look at what they committed (one
// write each).
func RunTxAccess(t *testing.T, s store.TxStore, use func(ctx context.Context) error, notRequestHint string, check func(t *testing.T)) {
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
		wantNoTx(t, "without a transaction", use(context.Background()), notRequestHint)
	})

	e, err := core.New(s, core.WithSingleCaller(), core.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
	if err != nil {
		t.Fatal(err)
	}
	var leasedErr, atomicErr error
	leased := e.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		leasedErr = use(r.Context())
		w.WriteHeader(http.StatusCreated)
	}), core.Scope("leased"), core.Leased())
	atomic := e.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		atomicErr = use(r.Context())
		w.WriteHeader(http.StatusCreated)
	}), core.Scope("atomic"))
	send := func(h http.Handler) {
		r := httptest.NewRequest("POST", "/", nil)
		r.Header.Set(core.HeaderKey, "k1")
		h.ServeHTTP(httptest.NewRecorder(), r)
	}
	t.Run("LeasedRoute", func(t *testing.T) {
		send(leased)
		if leasedErr != nil {
			t.Fatalf("in a Leased route: %v, want the leased attempt's own transaction", leasedErr)
		}
	})
	t.Run("AtomicRoute", func(t *testing.T) {
		send(atomic)
		if atomicErr != nil {
			t.Fatalf("in an atomic route: %v", atomicErr)
		}
		if check != nil {
			check(t)
		}
	})
}
