package core_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/memstore"
	"github.com/idemkit/idem/core/store"
)

// TestNoAttemptFailsLoudly: asking for an attempt's downstream key (or
// marking an effect, or releasing) with a context that carries no
// protected request returns an error wrapping ErrNoAttempt that names the
// right call, never an empty key.
func TestNoAttemptFailsLoudly(t *testing.T) {
	wantNoAttempt := func(t *testing.T, what string, err error) {
		t.Helper()
		if !errors.Is(err, core.ErrNoAttempt) {
			t.Fatalf("%s: error %v, want ErrNoAttempt", what, err)
		}
		for _, hint := range []string{"c.Request.Context()", "c.Request().Context()", "r.Context()"} {
			if !strings.Contains(err.Error(), hint) {
				t.Errorf("%s: error %q does not name %s", what, err, hint)
			}
		}
	}
	check := func(t *testing.T, ctx context.Context) {
		t.Helper()
		key, err := core.DownstreamKey(ctx, "charge")
		if key != "" {
			t.Errorf("DownstreamKey returned %q outside a protected request", key)
		}
		wantNoAttempt(t, "DownstreamKey", err)
		wantNoAttempt(t, "MarkEffect", core.MarkEffect(ctx))
		wantNoAttempt(t, "Release", core.Release(ctx))
	}
	t.Run("BackgroundContext", func(t *testing.T) { check(t, context.Background()) })

	e, err := core.New(memstore.New(), core.WithSingleCaller(), quiet)
	if err != nil {
		t.Fatal(err)
	}
	var inside, passed context.Context
	h := e.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == "GET" {
			passed = r.Context()
		} else {
			inside = r.Context()
		}
	}), core.Scope("orders"))
	t.Run("PassedThroughUnprotected", func(t *testing.T) {
		h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/orders", nil))
		check(t, passed)
	})
	t.Run("ProtectedRequest", func(t *testing.T) {
		r := httptest.NewRequest("POST", "/orders", nil)
		r.Header.Set(core.HeaderKey, "k1")
		h.ServeHTTP(httptest.NewRecorder(), r)
		key, err := core.DownstreamKey(inside, "charge")
		if err != nil || key == "" {
			t.Fatalf("DownstreamKey = %q, %v inside a protected request", key, err)
		}
		if _, err := core.DownstreamKey(inside, ""); !errors.Is(err, core.ErrConfig) {
			t.Errorf("an empty step: %v, want ErrConfig", err)
		}
		// The request has ended: its attempt was settled, so a MarkEffect
		// now would cover nothing and must say so (issue 21, item 4).
		if err := core.MarkEffect(inside); !errors.Is(err, core.ErrNoAttempt) {
			t.Errorf("MarkEffect after the attempt settled: %v, want an error wrapping ErrNoAttempt", err)
		}
	})
}

// routeAtomic reports whether rt runs in atomic mode, as a request's
// handler sees it (AttemptFrom).
func routeAtomic(t *testing.T, rt *core.Route) bool {
	t.Helper()
	var atomic bool
	_, _, err := rt.Exec(context.Background(), core.Request{Key: []string{"probe"}}, func(ctx context.Context) *core.Response {
		info, _ := core.AttemptFrom(ctx)
		atomic = info.Atomic
		return &core.Response{Status: http.StatusOK}
	})
	if err != nil {
		t.Fatal(err)
	}
	return atomic
}

// TestAtomicRouteNeedsTxStore: a route that asks for atomic mode (Atomic)
// on an engine whose store has no transactions fails when it is built,
// with an error wrapping ErrConfig that names the SQL stores; on a
// TxStore it is atomic, and Atomic with Leased is refused.
func TestAtomicRouteNeedsTxStore(t *testing.T) {
	build := func(t *testing.T, s store.Store, opts ...core.RouteOption) (rt *core.Route, err error) {
		t.Helper()
		e, nerr := core.New(s, core.WithSingleCaller())
		if nerr != nil {
			t.Fatal(nerr)
		}
		defer func() {
			if v := recover(); v != nil {
				var ok bool
				if err, ok = v.(error); !ok {
					t.Fatalf("panic with %T %v, want an error", v, v)
				}
			}
		}()
		return e.Route(opts...), nil
	}
	t.Run("nok, a store without transactions", func(t *testing.T) {
		_, err := build(t, memstore.New(), core.Atomic())
		if !errors.Is(err, core.ErrConfig) {
			t.Fatalf("Route(Atomic()) on memstore.New(): %v, want a panic with ErrConfig", err)
		}
		for _, name := range []string{"sqlstore", "gormstore", "pgxstore", "Atomic"} {
			if !strings.Contains(err.Error(), name) {
				t.Errorf("error %q does not name %s", err, name)
			}
		}
	})
	t.Run("ok, a TxStore", func(t *testing.T) {
		rt, err := build(t, memstore.New().Atomic(), core.Atomic())
		if err != nil || !routeAtomic(t, rt) {
			t.Fatalf("Route(Atomic()) on a TxStore: (%v, %v), want an atomic route", rt, err)
		}
	})
	t.Run("nok, Atomic and Leased", func(t *testing.T) {
		if _, err := build(t, memstore.New().Atomic(), core.Atomic(), core.Leased()); !errors.Is(err, core.ErrConfig) {
			t.Fatalf("Route(Atomic(), Leased()): %v, want a panic with ErrConfig", err)
		}
	})
}
