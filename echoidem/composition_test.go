package echoidem_test

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/idemkit/idem/echoidem"
	"github.com/idemkit/idem/internal/adaptertest"
	"github.com/labstack/echo/v4"
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
// not-protected), never passed through unprotected; unknown paths keep
// Echo's 404.
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
	if w := adaptertest.Do(r, "POST", "/nowhere", "k1"); w.Code != http.StatusNotFound {
		t.Errorf("unknown path: %d, want Echo's 404", w.Code)
	}
}

// TestBodyConsumedUpstream: a middleware before echoidem that reads the
// body without restoring it (as c.Bind does) makes the request refused
// (500, body-consumed), never fingerprinted as empty.
func TestBodyConsumedUpstream(t *testing.T) {
	e, _ := adaptertest.NewEngine(t, nil)
	r := echo.New()
	r.Use(func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			_, _ = io.ReadAll(c.Request().Body)
			return next(c)
		}
	})
	r.Use(echoidem.New(e))
	runs := 0
	r.POST("/orders", counter(&runs))

	w := adaptertest.Do(r, "POST", "/orders", "k1")
	if w.Code != http.StatusInternalServerError || !strings.Contains(w.Body.String(), "body-consumed") {
		t.Errorf("consumed body: %d %q, want a 500 body-consumed problem", w.Code, w.Body)
	}
	if runs != 0 {
		t.Errorf("the handler ran %d times, want 0", runs)
	}
}
