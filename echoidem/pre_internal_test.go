package echoidem

import (
	"net/http"
	"testing"

	"github.com/idemkit/idem/internal/adaptertest"
	"github.com/labstack/echo/v4"
	"github.com/labstack/echo/v4/middleware"
)

// TestPreInstalledReadsEcho: echoidem tells a Pre install from a Use install
// by reading Echo's Pre middleware (an unexported field). If an Echo
// upgrade renames or retypes it, this fails instead of the middleware
// silently falling back to asking the router.
func TestPreInstalledReadsEcho(t *testing.T) {
	eng, _ := adaptertest.NewEngine(t, nil)
	cases := []struct {
		name    string
		install func(*echo.Echo)
		want    bool
	}{
		{"Pre", func(e *echo.Echo) { e.Pre(middleware.RemoveTrailingSlash(), New(eng)) }, true},
		{"Use behind Pre", func(e *echo.Echo) { e.Pre(middleware.RemoveTrailingSlash()); e.Use(New(eng)) }, false},
		{"no Pre", func(e *echo.Echo) { e.Use(New(eng)) }, false},
	}
	for _, tc := range cases {
		e := echo.New()
		tc.install(e)
		installed, known := preInstalled(e)
		if !known || installed != tc.want {
			t.Errorf("%s: preInstalled = %v, %v; want %v, true", tc.name, installed, known, tc.want)
		}
	}
}

// TestPreFallbackAsksTheRouter: when Echo's Pre middleware cannot be read
// (a later Echo version), a Pre install still refuses a request that
// reaches a route as it stands (500 not-protected), never passes it
// through unprotected.
func TestPreFallbackAsksTheRouter(t *testing.T) {
	saved := premiddleware
	premiddleware = nil
	defer func() { premiddleware = saved }()

	eng, _ := adaptertest.NewEngine(t, nil)
	e := echo.New()
	e.Pre(New(eng))
	runs := 0
	e.POST("/orders/:id", func(c echo.Context) error { runs++; return c.NoContent(http.StatusCreated) })
	if w := adaptertest.Do(e, "POST", "/orders/7", "k1"); w.Code != http.StatusInternalServerError || runs != 0 {
		t.Errorf("a route under Pre: %d, runs %d; want 500 and no run", w.Code, runs)
	}
	if w := adaptertest.Do(e, "POST", "/nowhere", "k1"); w.Code != http.StatusNotFound {
		t.Errorf("an unknown path under Pre: %d, want the router's 404", w.Code)
	}
}
