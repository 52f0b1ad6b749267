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
// upgrade renames or retypes it, this fails, instead of the middleware
// quietly refusing every request that matches no route.
func TestPreInstalledReadsEcho(t *testing.T) {
	if premiddleware == nil {
		t.Fatal("echo.Echo has no premiddleware []echo.MiddlewareFunc field any more: echoidem cannot tell a Pre install from a Use install (docs/decisions.md, Echo's Pre)")
	}
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
		if got := preInstalled(e); got != tc.want {
			t.Errorf("%s: preInstalled = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestUnreadablePreFailsClosed: when Echo's Pre middleware cannot be read
// (a later Echo version), a covered request that reached no route is
// refused (500 not-protected) rather than passed through: it may be one a
// Pre install has not routed yet. A route Echo matched is still protected.
func TestUnreadablePreFailsClosed(t *testing.T) {
	saved := premiddleware
	premiddleware = nil
	defer func() { premiddleware = saved }()

	eng, _ := adaptertest.NewEngine(t, nil)
	e := echo.New()
	e.Use(New(eng))
	runs := 0
	e.POST("/orders/:id", func(c echo.Context) error { runs++; return c.NoContent(http.StatusCreated) })
	if w := adaptertest.Do(e, "POST", "/orders/7", "k1"); w.Code != http.StatusCreated || runs != 1 {
		t.Errorf("a routed request: %d, runs %d; want 201 and one run", w.Code, runs)
	}
	if w := adaptertest.Do(e, "POST", "/nowhere", "k1"); w.Code != http.StatusInternalServerError {
		t.Errorf("an unknown path: %d, want a 500 not-protected (fail closed)", w.Code)
	}
}
