package echo5idem_test

import (
	"net/http"
	"regexp"
	"testing"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/scenario"
	"github.com/idemkit/idem/echo5idem"
	"github.com/labstack/echo/v5"
	"github.com/labstack/echo/v5/middleware"
)

// param matches a ServeMux/chi path parameter ("{id}").
var param = regexp.MustCompile(`\{(\w+)\}`)

// echoPattern translates "/orders/{id}" to Echo's "/orders/:id".
func echoPattern(p string) string { return param.ReplaceAllString(p, ":$1") }

func TestScenarios(t *testing.T) {
	scenario.Run(t, func(t *testing.T, e *core.Engine, routes []scenario.Route) http.Handler {
		r := echo.New() // no recovery: panics must reach the suite
		for _, rt := range routes {
			r.Add(rt.Method, echoPattern(rt.Pattern), echo.WrapHandler(rt.Handler), echo5idem.New(e, rt.Options...))
		}
		return r
	})
}

// global installs the middleware for the whole router, skipping the
// routes marked Skip with Config.Skipper, behind the middleware before.
func global(e *core.Engine, routes []scenario.Route, before ...echo.MiddlewareFunc) http.Handler {
	r := echo.New()
	skipped := map[string]bool{}
	for _, rt := range routes {
		skipped[echoPattern(rt.Pattern)] = rt.Skip
	}
	r.Use(before...)
	r.Use(echo5idem.NewWithConfig(echo5idem.Config{Engine: e, Skipper: func(c *echo.Context) bool { return skipped[c.Path()] }}))
	for _, rt := range routes {
		r.Add(rt.Method, echoPattern(rt.Pattern), echo.WrapHandler(rt.Handler))
	}
	return r
}

func TestScenariosGlobal(t *testing.T) {
	scenario.RunGlobal(t, func(t *testing.T, e *core.Engine, routes []scenario.Route) http.Handler {
		return global(e, routes)
	})
}

// TestScenariosRecovered: middleware.Recover before the middleware answers
// a handler's panic inside the router, with Echo's own response given back.
func TestScenariosRecovered(t *testing.T) {
	scenario.RunRecovered(t, func(t *testing.T, e *core.Engine, routes []scenario.Route) http.Handler {
		return global(e, routes, middleware.RecoverWithConfig(middleware.RecoverConfig{DisablePrintStack: true}))
	})
}

func TestScenariosNested(t *testing.T) {
	scenario.RunNested(t, func(t *testing.T, e *core.Engine, routes []scenario.Route) http.Handler {
		r := echo.New()
		r.Use(echo5idem.New(e))
		for _, rt := range routes {
			r.Add(rt.Method, echoPattern(rt.Pattern), echo.WrapHandler(rt.Handler), echo5idem.New(e, rt.Options...))
		}
		return r
	})
}

// TestScenariosWithinRoute serves every route with core.Route.Within
// called from an Echo handler, in a transaction the service opens
// (scenario.StoreTx).
func TestScenariosWithinRoute(t *testing.T) {
	scenario.RunWithin(t, func(t *testing.T, e *core.Engine, routes []scenario.Route) http.Handler {
		r := echo.New()
		inTx := scenario.StoreTx(e)
		for _, rt := range routes {
			route := e.Route(rt.Options...)
			r.Add(rt.Method, echoPattern(rt.Pattern), func(c *echo.Context) error {
				route.Within(c.Response(), c.Request(), inTx, rt.Handler)
				return nil
			})
		}
		return r
	})
}

// TestScenariosWithin serves every route with echo5idem.Within, in a
// transaction the service opens (scenario.StoreTx).
func TestScenariosWithin(t *testing.T) {
	scenario.RunWithin(t, func(t *testing.T, e *core.Engine, routes []scenario.Route) http.Handler {
		r := echo.New()
		inTx := scenario.StoreTx(e)
		for _, rt := range routes {
			route := e.Route(rt.Options...)
			r.Add(rt.Method, echoPattern(rt.Pattern), func(c *echo.Context) error {
				return echo5idem.Within(c, route, inTx, echo.WrapHandler(rt.Handler))
			})
		}
		return r
	})
}
