package chiidem_test

import (
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/go-chi/chi/v5"
	"github.com/go-chi/chi/v5/middleware"
	"github.com/idemkit/idem/chiidem"
	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/internal/adaptertest"
)

// TestRewritingMiddleware: chiidem installed with Use in a sub-router,
// under a root middleware that rewrites the routing path, protects the
// route under its pattern: no key is a 400, a duplicate is replayed.
func TestRewritingMiddleware(t *testing.T) {
	for _, c := range []struct {
		name    string
		rewrite func(http.Handler) http.Handler
		path    string
	}{
		{"StripSlashes", middleware.StripSlashes, "/api/orders/"},
		{"URLFormat", middleware.URLFormat, "/api/orders.json"},
		{"CleanPath", middleware.CleanPath, "/api//orders"},
	} {
		t.Run(c.name, func(t *testing.T) {
			e, ev := adaptertest.NewEngine(t, nil)
			r := chi.NewRouter()
			r.Use(c.rewrite)
			runs := 0
			r.Route("/api", func(sr chi.Router) {
				sr.Use(chiidem.New(e))
				sr.Post("/orders", counter(&runs))
			})

			if w := adaptertest.Do(r, "POST", c.path, ""); w.Code != http.StatusBadRequest {
				t.Fatalf("no key: %d %q, want 400 (the route must be protected)", w.Code, w.Body)
			}
			first := adaptertest.Do(r, "POST", c.path, "k1")
			if first.Code != http.StatusCreated {
				t.Fatalf("first: %d %q", first.Code, first.Body)
			}
			if got := ev.Route(); got != "/api/orders" {
				t.Errorf("route %q, want the label /api/orders", got)
			}
			if w := adaptertest.Do(r, "POST", c.path, "k1"); !adaptertest.Replayed(w) || runs != 1 {
				t.Errorf("duplicate: %d %q, %d runs, want a replay and 1 run", w.Code, w.Body, runs)
			}
			if w := adaptertest.Do(r, "POST", "/api/nowhere", "k2"); w.Code != http.StatusNotFound {
				t.Errorf("unknown path under the sub-router: %d, want the router's 404", w.Code)
			}
		})
	}
}

// TestRewriterAfterTheMiddleware: a rewriting middleware installed after
// chiidem in the same router would route the request to a protected
// handler chiidem could not find: the request is refused (fail closed),
// never passed through; a path no route serves keeps the router's 404.
func TestRewriterAfterTheMiddleware(t *testing.T) {
	e, _ := adaptertest.NewEngine(t, nil)
	r := chi.NewRouter()
	r.Use(chiidem.New(e))
	r.Use(middleware.StripSlashes)
	runs := 0
	r.Post("/orders", counter(&runs))

	for _, key := range []string{"", "k1", "k1"} {
		w := adaptertest.Do(r, "POST", "/orders/", key)
		if w.Code != http.StatusInternalServerError || !strings.Contains(w.Body.String(), "not-protected") {
			t.Errorf("key %q: %d %q, want a 500 problem document (fail closed)", key, w.Code, w.Body)
		}
	}
	if runs != 0 {
		t.Errorf("the handler ran %d times unprotected", runs)
	}
	if w := adaptertest.Do(r, "POST", "/orders", "k1"); w.Code != http.StatusCreated {
		t.Errorf("the route's own path: %d, want 201", w.Code)
	}
	if w := adaptertest.Do(r, "POST", "/nowhere/", "k1"); w.Code != http.StatusNotFound {
		t.Errorf("unknown path: %d, want the router's 404", w.Code)
	}
}

// TestRewriterInSubRouter: chiidem installed in the root and a rewriting
// middleware in the sub-router the request goes on to: refused (fail
// closed), never passed through.
func TestRewriterInSubRouter(t *testing.T) {
	e, _ := adaptertest.NewEngine(t, nil)
	r := chi.NewRouter()
	r.Use(chiidem.New(e))
	runs := 0
	r.Route("/api", func(sr chi.Router) {
		sr.Use(middleware.StripSlashes)
		sr.Post("/orders", counter(&runs))
	})
	for _, key := range []string{"", "k1", "k1"} {
		if w := adaptertest.Do(r, "POST", "/api/orders/", key); w.Code != http.StatusInternalServerError || !strings.Contains(w.Body.String(), "not-protected") {
			t.Errorf("key %q: %d %q, want a 500 not-protected problem (fail closed)", key, w.Code, w.Body)
		}
	}
	if runs != 0 {
		t.Errorf("the handler ran %d times unprotected", runs)
	}
	if w := adaptertest.Do(r, "POST", "/api/orders", ""); w.Code != http.StatusBadRequest {
		t.Errorf("the route's own path without a key: %d, want 400", w.Code)
	}
	if w := adaptertest.Do(r, "POST", "/api/nowhere/", "k1"); w.Code != http.StatusNotFound {
		t.Errorf("unknown path: %d, want the router's 404", w.Code)
	}
}

// TestMount: a non-chi handler mounted under a router protected with Use
// is protected, its decisions labelled with the mount's pattern.
func TestMount(t *testing.T) {
	for _, c := range []struct {
		name  string
		build func(e *core.Engine, h http.Handler) http.Handler
		route string
	}{
		{"root", func(e *core.Engine, h http.Handler) http.Handler {
			r := chi.NewRouter()
			r.Use(chiidem.New(e))
			r.Mount("/legacy", h)
			return r
		}, "/legacy/*"},
		{"sub-router under StripSlashes", func(e *core.Engine, h http.Handler) http.Handler {
			r := chi.NewRouter()
			r.Use(middleware.StripSlashes)
			r.Route("/api", func(sr chi.Router) {
				sr.Use(chiidem.New(e))
				sr.Mount("/legacy", h)
			})
			return r
		}, "/api/legacy/*"},
	} {
		t.Run(c.name, func(t *testing.T) {
			e, ev := adaptertest.NewEngine(t, nil)
			runs := 0
			r := c.build(e, counter(&runs))
			prefix := strings.TrimSuffix(c.route, "/*")
			if w := adaptertest.Do(r, "POST", prefix+"/a/b/", ""); w.Code != http.StatusBadRequest {
				t.Fatalf("no key: %d %q, want 400 (the mount must be protected)", w.Code, w.Body)
			}
			adaptertest.Do(r, "POST", prefix+"/a/b/", "k1")
			if got := ev.Route(); got != c.route {
				t.Errorf("route %q, want %q", got, c.route)
			}
			if w := adaptertest.Do(r, "POST", prefix+"/a/b/", "k1"); !adaptertest.Replayed(w) || runs != 1 {
				t.Errorf("duplicate: %d, %d runs, want a replay and 1 run", w.Code, runs)
			}
		})
	}
}

// TestConfigWithoutEngine: a Config without an engine is a configuration
// error.
func TestConfigWithoutEngine(t *testing.T) {
	if _, err := (chiidem.Config{}).ToMiddleware(); !errors.Is(err, core.ErrConfig) {
		t.Errorf("ToMiddleware without an engine: %v, want core.ErrConfig", err)
	}
}

// TestRewritersCombinedAfterTheMiddleware: two of chi's rewriting
// middlewares installed after chiidem route a request only together
// (neither rewrite alone reaches the route): the request is refused, never
// passed through unprotected.
func TestRewritersCombinedAfterTheMiddleware(t *testing.T) {
	for _, c := range []struct {
		name string
		mws  []func(http.Handler) http.Handler
		path string
	}{
		{"StripSlashes, URLFormat", []func(http.Handler) http.Handler{middleware.StripSlashes, middleware.URLFormat}, "/orders.json/"},
		{"CleanPath, URLFormat", []func(http.Handler) http.Handler{middleware.CleanPath, middleware.URLFormat}, "//orders.json"},
	} {
		t.Run(c.name, func(t *testing.T) {
			e, _ := adaptertest.NewEngine(t, nil)
			r := chi.NewRouter()
			r.Use(chiidem.New(e))
			r.Use(c.mws...)
			runs := 0
			r.Post("/orders", counter(&runs))
			for _, key := range []string{"", "k1", "k1"} {
				w := adaptertest.Do(r, "POST", c.path, key)
				if w.Code != http.StatusInternalServerError || !strings.Contains(w.Body.String(), "not-protected") {
					t.Errorf("key %q: %d %q, want a 500 not-protected problem (fail closed)", key, w.Code, w.Body)
				}
			}
			if runs != 0 {
				t.Errorf("the handler ran %d times unprotected", runs)
			}
			if w := adaptertest.Do(r, "POST", "/nowhere.json/", "k1"); w.Code != http.StatusNotFound {
				t.Errorf("a path no rewrite routes: %d, want the router's 404", w.Code)
			}
		})
	}
}

// TestRewriterNotInstalledKeepsTheRouterAnswer: a path that only a
// sequence including a rewriter that is not installed would route is the
// router's 404, not a refusal.
func TestRewriterNotInstalledKeepsTheRouterAnswer(t *testing.T) {
	e, _ := adaptertest.NewEngine(t, nil)
	r := chi.NewRouter()
	r.Use(chiidem.New(e))
	r.Use(middleware.URLFormat) // StripSlashes is not installed
	runs := 0
	r.Post("/orders", counter(&runs))
	if w := adaptertest.Do(r, "POST", "/orders.json/", "k1"); w.Code != http.StatusNotFound {
		t.Errorf("%d %q, want the router's 404", w.Code, w.Body)
	}
	if runs != 0 {
		t.Errorf("the handler ran %d times", runs)
	}
}

// TestSubRouterAnswers: chiidem looks the route up before chi routes, in
// the router it runs in: a path no sub-router knows, under a sub-router
// without the middleware or with its own, keeps chi's 404 with or without
// a key, never recorded and never reported (the scenario suite's
// RouterAnswersUntouched checks a router without sub-routers).
func TestSubRouterAnswers(t *testing.T) {
	e, ev := adaptertest.NewEngine(t, nil)
	n := 0
	r := chi.NewRouter()
	r.Use(chiidem.New(e))
	r.Route("/api", func(r chi.Router) { r.Get("/orders", counter(&n)) })
	r.Route("/v2", func(r chi.Router) {
		r.Use(chiidem.New(e))
		r.Post("/orders", counter(&n))
	})
	for _, path := range []string{"/api/nope", "/v2/nope"} {
		for _, key := range []string{"", "k", "k"} {
			if w := adaptertest.Do(r, "POST", path, key); w.Code != http.StatusNotFound || adaptertest.Replayed(w) {
				t.Errorf("POST %s (key %q): %d replayed=%v, want chi's 404 untouched", path, key, w.Code, adaptertest.Replayed(w))
			}
		}
	}
	if n != 0 || ev.Len() != 0 {
		t.Errorf("runs %d, %d decisions (the last labelled %q); want no run and no decision", n, ev.Len(), ev.Route())
	}
}
