package chiidem_test

import (
	"errors"
	"io"
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

// TestSkipper: a global install with a Skipper leaves the skipped
// requests unprotected and protects the others.
func TestSkipper(t *testing.T) {
	e, _ := adaptertest.NewEngine(t, nil)
	r := chi.NewRouter()
	r.Use(chiidem.NewWithConfig(chiidem.Config{Engine: e, Skipper: func(r *http.Request) bool {
		return strings.HasPrefix(r.URL.Path, "/webhooks/")
	}}))
	var orders, hooks int
	r.Post("/orders", counter(&orders))
	r.Post("/webhooks/{provider}", counter(&hooks))

	for i := 1; i <= 2; i++ {
		if w := adaptertest.Do(r, "POST", "/webhooks/stripe", ""); w.Code != http.StatusCreated || adaptertest.Replayed(w) {
			t.Fatalf("skipped route, run %d: %d %q, want the handler's 201", i, w.Code, w.Body)
		}
	}
	if hooks != 2 {
		t.Errorf("the skipped route ran %d times, want 2", hooks)
	}
	if w := adaptertest.Do(r, "POST", "/orders", ""); w.Code != http.StatusBadRequest {
		t.Errorf("protected route without a key: %d, want 400", w.Code)
	}
	adaptertest.Do(r, "POST", "/orders", "k1")
	if w := adaptertest.Do(r, "POST", "/orders", "k1"); !adaptertest.Replayed(w) || orders != 1 {
		t.Errorf("protected route: duplicate not replayed (%d runs)", orders)
	}
}

// TestConfigWithoutEngine: a Config without an engine is a configuration
// error.
func TestConfigWithoutEngine(t *testing.T) {
	if _, err := (chiidem.Config{}).ToMiddleware(); !errors.Is(err, core.ErrConfig) {
		t.Errorf("ToMiddleware without an engine: %v, want core.ErrConfig", err)
	}
}

// TestBodyConsumedUpstream: a middleware before chiidem that reads the
// body without restoring it makes the request refused (500,
// body-consumed), never fingerprinted as empty.
func TestBodyConsumedUpstream(t *testing.T) {
	e, _ := adaptertest.NewEngine(t, nil)
	r := chi.NewRouter()
	r.Use(func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.ReadAll(r.Body)
			next.ServeHTTP(w, r)
		})
	})
	r.Use(chiidem.New(e))
	runs := 0
	r.Post("/orders", counter(&runs))

	w := adaptertest.Do(r, "POST", "/orders", "k1")
	if w.Code != http.StatusInternalServerError || !strings.Contains(w.Body.String(), "body-consumed") {
		t.Errorf("consumed body: %d %q, want a 500 body-consumed problem", w.Code, w.Body)
	}
	if runs != 0 {
		t.Errorf("the handler ran %d times, want 0", runs)
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
