package core_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/memstore"
	"github.com/idemkit/idem/core/store"
)

// TestWithinMisuse: Route.Within used wrongly answers 500 not-protected,
// never runs the handler outside a transaction, and logs an error naming
// the fix.
func TestWithinMisuse(t *testing.T) {
	atomicStore := memstore.New().Atomic()
	begin := func(ctx context.Context, body func(context.Context) error) error {
		ctx, tx, err := atomicStore.Begin(ctx)
		if err != nil {
			return err
		}
		if err := body(ctx); err != nil {
			_ = tx.Rollback()
			return err
		}
		return tx.Commit()
	}
	for _, c := range []struct {
		name  string
		store store.Store
		route []core.RouteOption
		inTx  core.TxFunc
		fix   string // what the log names
	}{
		{"LeasedStore", memstore.New(), nil, begin, "needs an atomic route"},
		{"LeasedRoute", atomicStore, []core.RouteOption{core.Leased()}, begin, "needs an atomic route"},
		{"NilTxFunc", atomicStore, nil, nil, "needs a TxFunc"},
		{"NoTransaction", atomicStore, nil, func(ctx context.Context, body func(context.Context) error) error {
			return body(ctx) // forgot sqlstore.WithTx / gormstore.WithTx
		}, "sqlstore.WithTx(ctx, tx) or gormstore.WithTx(ctx, tx)"},
		{"BodyNotCalled", atomicStore, nil, func(ctx context.Context, body func(context.Context) error) error {
			return nil
		}, "returned without calling body"},
		{"BodyTwice", atomicStore, nil, func(ctx context.Context, body func(context.Context) error) error {
			_ = begin(ctx, body)
			return begin(ctx, body)
		}, "called body twice"},
	} {
		t.Run(c.name, func(t *testing.T) { checkRefused(t, c.store, c.route, "k1", c.inTx, c.name == "BodyTwice", c.fix) })
	}
	// A request the route does not protect (KeyOptional without a key)
	// runs in the TxFunc too: the same misuse is refused the same way.
	for _, c := range []struct {
		name, fix string
		inTx      core.TxFunc
	}{
		{"Unprotected/NoTransaction", "sqlstore.WithTx(ctx, tx) or gormstore.WithTx(ctx, tx)", func(ctx context.Context, body func(context.Context) error) error {
			return body(ctx)
		}},
		{"Unprotected/BodyNotCalled", "returned without calling body", func(ctx context.Context, body func(context.Context) error) error {
			return nil
		}},
		{"Unprotected/BodyTwice", "called body twice", func(ctx context.Context, body func(context.Context) error) error {
			_ = begin(ctx, body)
			return begin(ctx, body)
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			checkRefused(t, atomicStore, []core.RouteOption{core.KeyOptional()}, "", c.inTx, c.name == "Unprotected/BodyTwice", c.fix)
		})
	}
}

// checkRefused runs one request through route.Within with inTx (with the
// key, when not empty) and asserts the 500 not-protected answer, the
// handler run once when the first body call runs it (firstRuns) and never
// otherwise, and the fix named in the log or the answer.
func checkRefused(t *testing.T, st store.Store, opts []core.RouteOption, key string, inTx core.TxFunc, firstRuns bool, fix string) {
	t.Helper()
	var log bytes.Buffer
	e, err := core.New(st, core.WithSingleCaller(), core.WithLogger(slog.New(slog.NewTextHandler(&log, nil))))
	if err != nil {
		t.Fatal(err)
	}
	ran := 0
	r := httptest.NewRequest("POST", "/orders", strings.NewReader(`{}`))
	if key != "" {
		r.Header.Set(core.HeaderKey, key)
	}
	w := httptest.NewRecorder()
	e.Route(opts...).Within(w, r, inTx, func(w http.ResponseWriter, r *http.Request) {
		ran++
		w.Header().Set("Location", "/orders/1")
		w.Header().Set("Content-Encoding", "gzip")
		w.WriteHeader(http.StatusCreated)
	})
	if want := map[bool]int{true: 1}[firstRuns]; ran != want {
		// BodyTwice: the first body ran; the second is refused, and the
		// request with it.
		t.Errorf("the handler ran %d times, want %d", ran, want)
	}
	if w.Code != http.StatusInternalServerError || !strings.Contains(w.Body.String(), "not-protected") {
		t.Errorf("answer %d %q, want a 500 not-protected problem", w.Code, w.Body)
	}
	if !strings.Contains(log.String(), fix) && !strings.Contains(w.Body.String(), fix) {
		t.Errorf("neither the log nor the answer names the fix %q:\n%s", fix, log.String())
	}
	// The withheld answer's header goes with it: the problem document is
	// not sent as gzip, nor with the withheld order's Location.
	for _, h := range []string{"Location", "Content-Encoding"} {
		if v := w.Header().Get(h); v != "" {
			t.Errorf("the refusal carries the withheld answer's %s: %q", h, v)
		}
	}
}

// TestWithinBeginFails: a TxFunc that cannot begin its transaction gets
// the 503 store-unavailable problem, without the driver's text.
func TestWithinBeginFails(t *testing.T) {
	e, err := core.New(memstore.New().Atomic(), core.WithSingleCaller(), quiet)
	if err != nil {
		t.Fatal(err)
	}
	r := httptest.NewRequest("POST", "/orders", strings.NewReader(`{}`))
	r.Header.Set(core.HeaderKey, "k1")
	w := httptest.NewRecorder()
	e.Route().Within(w, r, func(ctx context.Context, body func(context.Context) error) error {
		return errors.New("dial tcp 10.0.0.7:5432: connection refused")
	}, func(w http.ResponseWriter, r *http.Request) { t.Error("the handler ran") })
	if w.Code != http.StatusServiceUnavailable || !strings.Contains(w.Body.String(), "store-unavailable") || w.Header().Get("Retry-After") == "" {
		t.Errorf("answer %d %v %q, want the 503 store-unavailable problem with Retry-After", w.Code, w.Header(), w.Body)
	}
	if strings.Contains(w.Body.String(), "10.0.0.7") {
		t.Errorf("the driver's error reached the client: %q", w.Body)
	}
}

// TestWithinUnprotected: a request the route does not protect (KeyOptional
// without a key) runs its handler in the service's transaction every time,
// its answer delivered after the commit; a 5xx rolls the transaction back.
func TestWithinUnprotected(t *testing.T) {
	store := memstore.New().Atomic()
	e, err := core.New(store, core.WithSingleCaller(), quiet)
	if err != nil {
		t.Fatal(err)
	}
	var commits, rollbacks int
	inTx := func(ctx context.Context, body func(context.Context) error) error {
		ctx, tx, err := store.Begin(ctx)
		if err != nil {
			return err
		}
		if err := body(ctx); err != nil {
			rollbacks++
			_ = tx.Rollback()
			return err
		}
		commits++
		return tx.Commit()
	}
	route := e.Route(core.KeyOptional())
	for i, status := range []int{http.StatusCreated, http.StatusCreated, http.StatusBadGateway} {
		w := httptest.NewRecorder()
		route.Within(w, httptest.NewRequest("POST", "/orders", strings.NewReader(`{}`)), inTx, func(w http.ResponseWriter, r *http.Request) {
			if !store.InTx(r.Context()) {
				t.Error("the handler's context carries no transaction")
			}
			w.WriteHeader(status)
		})
		if w.Code != status || w.Header().Get(core.HeaderReplayed) != "" {
			t.Errorf("request %d: %d %v, want the handler's %d", i, w.Code, w.Header(), status)
		}
	}
	if commits != 2 || rollbacks != 1 {
		t.Errorf("%d commits and %d rollbacks, want 2 and 1", commits, rollbacks)
	}
}

// TestWithinRetriedBody: a TxFunc that retries body after a failed commit
// (a serialization failure's retry loop) misuses it, and the second call
// is refused; but the first call's handler ran past MarkEffect (the card
// was charged) and its transaction rolled back, so the record must be
// settled as after any failed commit: indeterminate, and the client's
// retry answered 500 outcome-unknown, never run again.
func TestWithinRetriedBody(t *testing.T) {
	store := memstore.New().Atomic()
	e, err := core.New(store, core.WithSingleCaller(), quiet)
	if err != nil {
		t.Fatal(err)
	}
	route := e.Route()
	retrying := func(ctx context.Context, body func(context.Context) error) error {
		for try := 0; ; try++ {
			tctx, tx, err := store.Begin(ctx)
			if err != nil {
				return err
			}
			err = body(tctx)
			_ = tx.Rollback() // the commit fails (40001): rolled back, and retried once
			if err != nil || try == 1 {
				return err
			}
		}
	}
	once := func(ctx context.Context, body func(context.Context) error) error {
		tctx, tx, err := store.Begin(ctx)
		if err != nil {
			return err
		}
		if err := body(tctx); err != nil {
			_ = tx.Rollback()
			return err
		}
		return tx.Commit()
	}
	charges := 0
	charge := func(w http.ResponseWriter, r *http.Request) {
		if err := core.MarkEffect(r.Context()); err != nil {
			t.Error(err)
		}
		charges++
		w.WriteHeader(http.StatusCreated)
	}
	for i, inTx := range []core.TxFunc{retrying, once} {
		r := httptest.NewRequest("POST", "/payments", strings.NewReader(`{"amount":100}`))
		r.Header.Set(core.HeaderKey, "pay-1")
		w := httptest.NewRecorder()
		route.Within(w, r, inTx, charge)
		if w.Code != http.StatusInternalServerError {
			t.Errorf("request %d: %d %q, want a 500", i, w.Code, w.Body)
		}
	}
	if charges != 1 {
		t.Errorf("the card was charged %d times, want 1: the retry ran the handler again", charges)
	}
}
