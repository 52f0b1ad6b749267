package chiidem_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"testing"

	"github.com/go-chi/chi/v5"
	"github.com/go-chi/chi/v5/middleware"
	"github.com/idemkit/idem/chiidem"
	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/memstore"
	"github.com/idemkit/idem/internal/adaptertest"
)

// counter is a handler that counts its runs and answers 201 with the count.
func counter(n *int) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		*n++
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"run":%d,"id":%q}`, *n, chi.URLParam(r, "id"))
	}
}

// TestRouteIsALabel: the identity never depends on the route (the scope is
// empty): two concrete paths of one route with one key address one
// record, and the second, another request, gets a 422. The route pattern,
// as chi names it wherever the middleware is installed, labels the
// decisions (observe.Event.Route).
func TestRouteIsALabel(t *testing.T) {
	type build func(mw func(http.Handler) http.Handler, h http.HandlerFunc) http.Handler
	tests := []struct {
		name         string
		build        build
		path1, path2 string
		route        string
	}{
		{"ok, global r.Use, before routing", func(mw func(http.Handler) http.Handler, h http.HandlerFunc) http.Handler {
			r := chi.NewRouter()
			r.Use(mw)
			r.Post("/orders/{id}/refunds", h)
			return r
		}, "/orders/1/refunds", "/orders/2/refunds", "/orders/{id}/refunds"},
		{"ok, per route with r.With", func(mw func(http.Handler) http.Handler, h http.HandlerFunc) http.Handler {
			r := chi.NewRouter()
			r.With(mw).Post("/orders/{id}/refunds", h)
			return r
		}, "/orders/1/refunds", "/orders/2/refunds", "/orders/{id}/refunds"},
		{"ok, r.Use in a sub-router", func(mw func(http.Handler) http.Handler, h http.HandlerFunc) http.Handler {
			r := chi.NewRouter()
			r.Route("/api", func(r chi.Router) {
				r.Use(mw)
				r.Post("/orders/{id}/refunds", h)
			})
			return r
		}, "/api/orders/1/refunds", "/api/orders/2/refunds", "/api/orders/{id}/refunds"},
		{"ok, global r.Use above a mounted router", func(mw func(http.Handler) http.Handler, h http.HandlerFunc) http.Handler {
			sub := chi.NewRouter()
			sub.Post("/orders/{id}/refunds", h)
			r := chi.NewRouter()
			r.Use(mw)
			r.Mount("/v1", sub)
			return r
		}, "/v1/orders/1/refunds", "/v1/orders/2/refunds", "/v1/orders/{id}/refunds"},
		{"ok, a group with a regexp parameter", func(mw func(http.Handler) http.Handler, h http.HandlerFunc) http.Handler {
			r := chi.NewRouter()
			r.Group(func(r chi.Router) {
				r.Use(mw)
				r.Post("/orders/{id:[0-9]+}", h)
			})
			return r
		}, "/orders/1", "/orders/2", "/orders/{id:[0-9]+}"},
		{"ok, global: a sub-router's root route is named as chi names it", func(mw func(http.Handler) http.Handler, h http.HandlerFunc) http.Handler {
			r := chi.NewRouter()
			r.Use(mw)
			r.Route("/api", func(r chi.Router) { r.Post("/", h) })
			return r
		}, "/api/", "/api/", "/api"},
		{"ok, per route: the same root route, the same name", func(mw func(http.Handler) http.Handler, h http.HandlerFunc) http.Handler {
			r := chi.NewRouter()
			r.Route("/api", func(r chi.Router) { r.With(mw).Post("/", h) })
			return r
		}, "/api/", "/api/", "/api"},
		{"ok, outside chi the ServeMux pattern is used", func(mw func(http.Handler) http.Handler, h http.HandlerFunc) http.Handler {
			mux := http.NewServeMux()
			mux.Handle("POST /orders/{id}/refunds", mw(h))
			return mux
		}, "/orders/1/refunds", "/orders/2/refunds", "/orders/{id}/refunds"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e, ev := adaptertest.NewEngine(t, nil)
			n := 0
			r := tt.build(chiidem.New(e), counter(&n))
			first, second := adaptertest.Do(r, "POST", tt.path1, "k"), adaptertest.Do(r, "POST", tt.path2, "k")
			// One record (a record of its own would run the handler): the
			// same path replays, another path (another id) is a 422.
			want, wantReplayed := 422, false
			if tt.path1 == tt.path2 {
				want, wantReplayed = 201, true
			}
			if first.Code != 201 || second.Code != want || adaptertest.Replayed(second) != wantReplayed || n != 1 {
				t.Fatalf("first %d %q, second %d %q replayed=%v, runs %d; want the second to meet the first's record: %d, replayed=%v",
					first.Code, first.Body, second.Code, second.Body, adaptertest.Replayed(second), n, want, wantReplayed)
			}
			if got := ev.Route(); got != tt.route || ev.Last() != "" {
				t.Fatalf("route %q scope %q, want the route %q and the empty scope", got, ev.Last(), tt.route)
			}
		})
	}
}

func TestRoutePathOverride(t *testing.T) {
	install := map[string]func(mw func(http.Handler) http.Handler, h http.HandlerFunc) http.Handler{
		"global": func(mw func(http.Handler) http.Handler, h http.HandlerFunc) http.Handler {
			r := chi.NewRouter()
			r.Use(middleware.URLFormat, mw)
			r.Post("/orders", h)
			return r
		},
		"per route": func(mw func(http.Handler) http.Handler, h http.HandlerFunc) http.Handler {
			r := chi.NewRouter()
			r.Use(middleware.URLFormat)
			r.With(mw).Post("/orders", h)
			return r
		},
	}
	for name, build := range install {
		t.Run("ok, "+name+": middleware.URLFormat routes /orders.json to /orders", func(t *testing.T) {
			e, ev := adaptertest.NewEngine(t, nil)
			n := 0
			r := build(chiidem.New(e), counter(&n))
			adaptertest.Do(r, "POST", "/orders.json", "k")
			if w := adaptertest.Do(r, "POST", "/orders.json", "k"); !adaptertest.Replayed(w) || n != 1 || ev.Route() != "/orders" {
				t.Fatalf("replayed=%v runs=%d route=%q, want a replay labelled /orders", adaptertest.Replayed(w), n, ev.Route())
			}
		})
	}
}

type accountKey struct{}

func TestCallerFromTheRequestContext(t *testing.T) {
	e, err := core.New(memstore.New(), core.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))),
		core.WithCaller(func(r *http.Request) (string, error) {
			account, _ := r.Context().Value(accountKey{}).(string)
			return account, nil
		}))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	r := chi.NewRouter()
	r.Use(func(next http.Handler) http.Handler { // the application's auth middleware
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if a := r.Header.Get("X-Account"); a != "" {
				r = r.WithContext(context.WithValue(r.Context(), accountKey{}, a))
			}
			next.ServeHTTP(w, r)
		})
	}, chiidem.New(e))
	r.Post("/orders", counter(&n))
	tests := []struct {
		name     string
		account  string
		code     int
		replayed bool
		runs     int
	}{
		{"ok, alice runs", "alice", 201, false, 1},
		{"ok, bob with alice's key gets his own execution", "bob", 201, false, 2},
		{"ok, alice's retry replays hers", "alice", 201, true, 2},
		{"nok, 401 without an account", "", 401, false, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := adaptertest.Do(r, "POST", "/orders", "k", "X-Account", tt.account)
			if w.Code != tt.code || adaptertest.Replayed(w) != tt.replayed || n != tt.runs {
				t.Fatalf("%d replayed=%v runs=%d, want %d %v %d", w.Code, adaptertest.Replayed(w), n, tt.code, tt.replayed, tt.runs)
			}
		})
	}
}

func TestNilEngine(t *testing.T) {
	defer func() {
		if err, _ := recover().(error); !errors.Is(err, core.ErrConfig) {
			t.Fatalf("recovered %v, want ErrConfig", err)
		}
	}()
	chiidem.New(nil)
}
