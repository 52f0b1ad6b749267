package echo5idem_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/idemkit/idem/echo5idem"
	"github.com/idemkit/idem/internal/adaptertest"
	"github.com/labstack/echo/v5"
	"github.com/labstack/echo/v5/middleware"
)

// TestGroupNotFound: a group with the middleware registers catch-all
// RouteNotFound routes (Echo does so for every group with middleware);
// requests they answer keep Echo's 404, with or without a key, and are
// never recorded. Routes of the group stay protected.
func TestGroupNotFound(t *testing.T) {
	e, _ := adaptertest.NewEngine(t, nil)
	r := echo.New()
	g := r.Group("/api", echo5idem.New(e))
	runs := 0
	g.POST("/orders", counter(&runs))
	g.GET("/orders/:id", counter(&runs))

	for _, path := range []string{"/api/nowhere", "/api", "/api/orders/7"} {
		for _, key := range []string{"", "k1", "k1"} {
			w := adaptertest.Do(r, "POST", path, key)
			if w.Code != http.StatusNotFound && w.Code != http.StatusMethodNotAllowed || adaptertest.Replayed(w) {
				t.Errorf("POST %s (key %q): %d %q, want Echo's own 404 or 405", path, key, w.Code, w.Body)
			}
		}
	}
	if w := adaptertest.Do(r, "POST", "/api/orders", ""); w.Code != http.StatusBadRequest {
		t.Errorf("a route of the group without a key: %d, want 400", w.Code)
	}
	if runs != 0 {
		t.Errorf("a handler ran %d times", runs)
	}
}

// TestInstalledWithPre: installed with Pre, the middleware runs before
// Echo routes the request; a request that reaches a route is refused (500
// not-protected), never passed through unprotected. So is a request to a
// path the router does not know yet: a later Pre middleware may rewrite it
// onto a route (TestInstalledWithPreBeforeRewrites).
func TestInstalledWithPre(t *testing.T) {
	e, _ := adaptertest.NewEngine(t, nil)
	r := echo.New()
	r.Pre(echo5idem.New(e))
	runs := 0
	r.POST("/orders/:id", counter(&runs))

	for _, key := range []string{"", "k1", "k1"} {
		if w := adaptertest.Do(r, "POST", "/orders/7", key); w.Code != http.StatusInternalServerError || !strings.Contains(w.Body.String(), "not-protected") {
			t.Errorf("key %q: %d %q, want a 500 not-protected problem (fail closed)", key, w.Code, w.Body)
		}
	}
	if runs != 0 {
		t.Errorf("the handler ran %d times unprotected", runs)
	}
	if w := adaptertest.Do(r, "POST", "/nowhere", "k1"); w.Code != http.StatusInternalServerError || !strings.Contains(w.Body.String(), "not-protected") {
		t.Errorf("unknown path: %d %q, want a 500 not-protected problem (fail closed)", w.Code, w.Body)
	}
	if w := adaptertest.Do(r, "GET", "/nowhere", ""); w.Code != http.StatusNotFound {
		t.Errorf("unknown path, a method not covered: %d, want Echo's 404", w.Code)
	}
}

// TestInstalledWithPreBeforeRewrites: installed with Pre before Pre
// middleware that rewrites the request (RemoveTrailingSlash, Rewrite,
// MethodOverride), the middleware cannot know which route the request
// will reach: a request that the router alone would answer with 404 or 405
// reaches a route once rewritten. It is refused (500 not-protected), never
// passed through to run its handler once per retry.
func TestInstalledWithPreBeforeRewrites(t *testing.T) {
	e, _ := adaptertest.NewEngine(t, nil)
	r := echo.New()
	r.Pre(echo5idem.New(e))
	r.Pre(middleware.RemoveTrailingSlash())
	r.Pre(middleware.MethodOverride())
	runs := 0
	r.POST("/orders", counter(&runs))
	r.PATCH("/items", counter(&runs))

	for _, key := range []string{"k1", "k1"} {
		if w := adaptertest.Do(r, "POST", "/orders/", key); w.Code != http.StatusInternalServerError || !strings.Contains(w.Body.String(), "not-protected") {
			t.Errorf("POST /orders/ (slash removed later), key %q: %d %q, want a 500 not-protected problem", key, w.Code, w.Body)
		}
	}
	for _, key := range []string{"k2", "k2"} {
		if w := adaptertest.Do(r, "POST", "/items", key, "X-HTTP-Method-Override", "PATCH"); w.Code != http.StatusInternalServerError || !strings.Contains(w.Body.String(), "not-protected") {
			t.Errorf("POST /items overridden to PATCH later, key %q: %d %q, want a 500 not-protected problem", key, w.Code, w.Body)
		}
	}
	if runs != 0 {
		t.Errorf("the handlers ran %d times unprotected", runs)
	}
}

// TestRouterAnswers: what Echo's router answers itself keeps its answer,
// with or without a key, and is never recorded: a RouteNotFound route of
// the application's own (a custom 404 page) and a known path with another
// method (405 with Allow). A route registered with Any is a route: its
// POSTs are protected.
func TestRouterAnswers(t *testing.T) {
	e, _ := adaptertest.NewEngine(t, nil)
	r := echo.New()
	r.Use(echo5idem.New(e))
	notFound, anyRuns, getRuns := 0, 0, 0
	r.RouteNotFound("/pages/*", func(c *echo.Context) error {
		notFound++
		return c.String(http.StatusNotFound, "no such page")
	})
	r.GET("/orders", counter(&getRuns))
	r.Any("/hooks", counter(&anyRuns))

	for i, key := range []string{"", "k1", "k1"} {
		if w := adaptertest.Do(r, "POST", "/pages/nowhere", key); w.Code != http.StatusNotFound || w.Body.String() != "no such page" || adaptertest.Replayed(w) {
			t.Errorf("RouteNotFound, key %q: %d %q replayed=%v, want the application's own 404", key, w.Code, w.Body, adaptertest.Replayed(w))
		}
		if notFound != i+1 {
			t.Errorf("RouteNotFound handler ran %d times after %d requests, want every time", notFound, i+1)
		}
		if w := adaptertest.Do(r, "POST", "/orders", key); w.Code != http.StatusMethodNotAllowed || w.Header().Get("Allow") == "" || adaptertest.Replayed(w) {
			t.Errorf("another method, key %q: %d Allow=%q replayed=%v, want Echo's 405 with Allow", key, w.Code, w.Header().Get("Allow"), adaptertest.Replayed(w))
		}
	}
	if w := adaptertest.Do(r, "POST", "/hooks", ""); w.Code != http.StatusBadRequest {
		t.Errorf("an Any route without a key: %d, want 400 (protected)", w.Code)
	}
	first, second := adaptertest.Do(r, "POST", "/hooks", "k2"), adaptertest.Do(r, "POST", "/hooks", "k2")
	if first.Code != http.StatusCreated || !same(first, second) || anyRuns != 1 {
		t.Errorf("an Any route: %d then %d replayed=%v, runs %d; want one run and a replay", first.Code, second.Code, adaptertest.Replayed(second), anyRuns)
	}
	if getRuns != 0 {
		t.Errorf("GET /orders ran %d times", getRuns)
	}
}
