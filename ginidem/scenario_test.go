package ginidem_test

import (
	"io"
	"net/http"
	"regexp"
	"testing"

	"github.com/gin-gonic/gin"
	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/scenario"
	"github.com/idemkit/idem/ginidem"
)

func init() { gin.SetMode(gin.TestMode) }

// param matches a ServeMux/chi path parameter ("{id}").
var param = regexp.MustCompile(`\{(\w+)\}`)

// ginPattern translates "/orders/{id}" to Gin's "/orders/:id".
func ginPattern(p string) string { return param.ReplaceAllString(p, ":$1") }

func TestScenarios(t *testing.T) {
	scenario.Run(t, func(t *testing.T, e *core.Engine, routes []scenario.Route) http.Handler {
		r := gin.New() // no recovery: panics must reach the suite
		for _, rt := range routes {
			r.Handle(rt.Method, ginPattern(rt.Pattern), ginidem.New(e, rt.Options...), gin.WrapF(rt.Handler))
		}
		return r
	})
}

// global installs the middleware for the whole router, skipping the
// routes marked Skip with Config.Skipper, behind the middleware before.
func global(e *core.Engine, routes []scenario.Route, before ...gin.HandlerFunc) http.Handler {
	r := gin.New()
	r.HandleMethodNotAllowed = true // so the router's own 405 is checked too
	skipped := map[string]bool{}
	for _, rt := range routes {
		skipped[ginPattern(rt.Pattern)] = rt.Skip
	}
	r.Use(before...)
	r.Use(ginidem.NewWithConfig(ginidem.Config{Engine: e, Skipper: func(c *gin.Context) bool { return skipped[c.FullPath()] }}))
	for _, rt := range routes {
		r.Handle(rt.Method, ginPattern(rt.Pattern), gin.WrapF(rt.Handler))
	}
	return r
}

func TestScenariosGlobal(t *testing.T) {
	scenario.RunGlobal(t, func(t *testing.T, e *core.Engine, routes []scenario.Route) http.Handler {
		return global(e, routes)
	})
}

// TestScenariosRecovered: gin.Recovery before the middleware answers a
// handler's panic inside the router, with Gin's own writer given back.
func TestScenariosRecovered(t *testing.T) {
	scenario.RunRecovered(t, func(t *testing.T, e *core.Engine, routes []scenario.Route) http.Handler {
		return global(e, routes, gin.RecoveryWithWriter(io.Discard))
	})
}

func TestScenariosNested(t *testing.T) {
	scenario.RunNested(t, func(t *testing.T, e *core.Engine, routes []scenario.Route) http.Handler {
		r := gin.New()
		r.HandleMethodNotAllowed = true
		r.Use(ginidem.New(e))
		for _, rt := range routes {
			r.Handle(rt.Method, ginPattern(rt.Pattern), ginidem.New(e, rt.Options...), gin.WrapF(rt.Handler))
		}
		return r
	})
}

// TestScenariosWithinRoute serves every route with core.Route.Within
// called from a Gin handler, in a transaction the service opens
// (scenario.StoreTx).
func TestScenariosWithinRoute(t *testing.T) {
	scenario.RunWithin(t, func(t *testing.T, e *core.Engine, routes []scenario.Route) http.Handler {
		r := gin.New()
		inTx := scenario.StoreTx(e)
		for _, rt := range routes {
			route := e.Route(rt.Options...)
			r.Handle(rt.Method, ginPattern(rt.Pattern), func(c *gin.Context) {
				route.Within(c.Writer, c.Request, inTx, rt.Handler)
			})
		}
		return r
	})
}

// TestScenariosWithin serves every route with ginidem.Within, in a
// transaction the service opens (scenario.StoreTx).
func TestScenariosWithin(t *testing.T) {
	scenario.RunWithin(t, func(t *testing.T, e *core.Engine, routes []scenario.Route) http.Handler {
		r := gin.New()
		inTx := scenario.StoreTx(e)
		for _, rt := range routes {
			route := e.Route(rt.Options...)
			r.Handle(rt.Method, ginPattern(rt.Pattern), func(c *gin.Context) {
				ginidem.Within(c, route, inTx, gin.WrapF(rt.Handler))
			})
		}
		return r
	})
}
