package echoidem_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/idemkit/idem/echoidem"
	"github.com/idemkit/idem/internal/adaptertest"
	"github.com/labstack/echo/v4"
	"github.com/labstack/echo/v4/middleware"
)

// TestGroupNotFound: a group with the middleware registers catch-all
// RouteNotFound routes (Echo does so for every group with middleware);
// requests they answer keep Echo's 404, with or without a key, and are
// never recorded. Routes of the group stay protected.
func TestGroupNotFound(t *testing.T) {
	e, _ := adaptertest.NewEngine(t, nil)
	r := echo.New()
	g := r.Group("/api", echoidem.New(e))
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
	r.Pre(echoidem.New(e))
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
	r.Pre(echoidem.New(e))
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

// TestUseAfterPreRewrites: installed with Use behind Pre middleware that
// rewrites the request, the middleware protects the route the rewritten
// request reaches, and a request that matches no route keeps Echo's own
// 404 (a request that matches nothing looks the same before and after
// routing: telling the two apart must not refuse it).
func TestUseAfterPreRewrites(t *testing.T) {
	e, _ := adaptertest.NewEngine(t, nil)
	r := echo.New()
	r.Pre(middleware.RemoveTrailingSlash())
	r.Pre(middleware.MethodOverride())
	r.Use(echoidem.New(e))
	runs := 0
	r.POST("/orders", counter(&runs))

	first, second := adaptertest.Do(r, "POST", "/orders/", "k1"), adaptertest.Do(r, "POST", "/orders/", "k1")
	if first.Code != http.StatusCreated || !same(first, second) || runs != 1 {
		t.Errorf("POST /orders/ (slash removed): %d then %d replayed=%v, runs %d; want one run and a replay", first.Code, second.Code, adaptertest.Replayed(second), runs)
	}
	for _, key := range []string{"", "k2", "k2"} {
		if w := adaptertest.Do(r, "POST", "/nowhere/", key); w.Code != http.StatusNotFound || adaptertest.Replayed(w) {
			t.Errorf("unknown path, key %q: %d %q, want Echo's own 404", key, w.Code, w.Body)
		}
	}
}
