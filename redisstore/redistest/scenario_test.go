package redistest

import (
	"net/http"
	"regexp"
	"testing"

	"github.com/gin-gonic/gin"
	"github.com/go-chi/chi/v5"
	echo4 "github.com/labstack/echo/v4"
	echo5 "github.com/labstack/echo/v5"

	"github.com/idemkit/idem/chiidem"
	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/scenario"
	"github.com/idemkit/idem/echo5idem"
	"github.com/idemkit/idem/echoidem"
	"github.com/idemkit/idem/ginidem"
)

func init() { gin.SetMode(gin.TestMode) }

// param matches a ServeMux/chi path parameter ("{id}").
var param = regexp.MustCompile(`\{(\w+)\}`)

// colon translates "/orders/{id}" to Gin's, Echo's and Fiber's "/orders/:id".
func colon(p string) string { return param.ReplaceAllString(p, ":$1") }

// adapter is one adapter's three factories, as its own scenario tests
// write them (no recovery: panics must reach the suite), and the
// scenario.Except options its own per-route run passes (Fiber's notFiber).
type adapter struct {
	name           string
	route          scenario.Factory
	global, nested func(t *testing.T, e *core.Engine, routes []scenario.Route) http.Handler
	except         []scenario.Option
	exceptGlobal   []scenario.Option // the global run's (Fiber's notFiberGlobal)
}

// notSkipped leaves SkippedRoute out of the global runs here: these
// factories install no skipper (each adapter's own run checks it), and a
// skipped route never reaches the store.
var notSkipped = scenario.Except("a skipped route never reaches the store; each adapter's own global run checks its skipper", "SkippedRoute")

var adapters = []adapter{
	{
		name: "gin",
		route: func(t *testing.T, e *core.Engine, routes []scenario.Route) http.Handler {
			r := gin.New()
			for _, rt := range routes {
				r.Handle(rt.Method, colon(rt.Pattern), ginidem.New(e, rt.Options...), gin.WrapF(rt.Handler))
			}
			return r
		},
		global: func(t *testing.T, e *core.Engine, routes []scenario.Route) http.Handler {
			r := gin.New()
			r.HandleMethodNotAllowed = true
			r.Use(ginidem.New(e))
			for _, rt := range routes {
				r.Handle(rt.Method, colon(rt.Pattern), gin.WrapF(rt.Handler))
			}
			return r
		},
		nested: func(t *testing.T, e *core.Engine, routes []scenario.Route) http.Handler {
			r := gin.New()
			r.HandleMethodNotAllowed = true
			r.Use(ginidem.New(e))
			for _, rt := range routes {
				r.Handle(rt.Method, colon(rt.Pattern), ginidem.New(e, rt.Options...), gin.WrapF(rt.Handler))
			}
			return r
		},
	},
	{
		name: "echo",
		route: func(t *testing.T, e *core.Engine, routes []scenario.Route) http.Handler {
			r := echo4.New()
			for _, rt := range routes {
				r.Add(rt.Method, colon(rt.Pattern), echo4.WrapHandler(rt.Handler), echoidem.New(e, rt.Options...))
			}
			return r
		},
		global: func(t *testing.T, e *core.Engine, routes []scenario.Route) http.Handler {
			r := echo4.New()
			r.Use(echoidem.New(e))
			for _, rt := range routes {
				r.Add(rt.Method, colon(rt.Pattern), echo4.WrapHandler(rt.Handler))
			}
			return r
		},
		nested: func(t *testing.T, e *core.Engine, routes []scenario.Route) http.Handler {
			r := echo4.New()
			r.Use(echoidem.New(e))
			for _, rt := range routes {
				r.Add(rt.Method, colon(rt.Pattern), echo4.WrapHandler(rt.Handler), echoidem.New(e, rt.Options...))
			}
			return r
		},
	},
	{
		name: "echo5",
		route: func(t *testing.T, e *core.Engine, routes []scenario.Route) http.Handler {
			r := echo5.New()
			for _, rt := range routes {
				r.Add(rt.Method, colon(rt.Pattern), echo5.WrapHandler(rt.Handler), echo5idem.New(e, rt.Options...))
			}
			return r
		},
		global: func(t *testing.T, e *core.Engine, routes []scenario.Route) http.Handler {
			r := echo5.New()
			r.Use(echo5idem.New(e))
			for _, rt := range routes {
				r.Add(rt.Method, colon(rt.Pattern), echo5.WrapHandler(rt.Handler))
			}
			return r
		},
		nested: func(t *testing.T, e *core.Engine, routes []scenario.Route) http.Handler {
			r := echo5.New()
			r.Use(echo5idem.New(e))
			for _, rt := range routes {
				r.Add(rt.Method, colon(rt.Pattern), echo5.WrapHandler(rt.Handler), echo5idem.New(e, rt.Options...))
			}
			return r
		},
	},
	{
		name: "chi",
		route: func(t *testing.T, e *core.Engine, routes []scenario.Route) http.Handler {
			r := chi.NewRouter()
			for _, rt := range routes {
				r.With(chiidem.New(e, rt.Options...)).MethodFunc(rt.Method, rt.Pattern, rt.Handler)
			}
			return r
		},
		global: func(t *testing.T, e *core.Engine, routes []scenario.Route) http.Handler {
			r := chi.NewRouter()
			r.Use(chiidem.New(e))
			for _, rt := range routes {
				r.MethodFunc(rt.Method, rt.Pattern, rt.Handler)
			}
			return r
		},
		nested: func(t *testing.T, e *core.Engine, routes []scenario.Route) http.Handler {
			r := chi.NewRouter()
			r.Use(chiidem.New(e))
			for _, rt := range routes {
				r.With(chiidem.New(e, rt.Options...)).MethodFunc(rt.Method, rt.Pattern, rt.Handler)
			}
			return r
		},
	},
	fiberAdapter, // fiber_test.go
}

// TestScenarios runs the scenario suite through every adapter on Redis,
// in leased mode (the store has no atomic mode: those scenarios are
// skipped), per route, installed globally, and both.
func TestScenarios(t *testing.T) {
	on := scenario.OnStore(onRedis(t))
	for _, a := range adapters {
		t.Run(a.name, func(t *testing.T) {
			t.Run("Route", func(t *testing.T) { scenario.Run(t, a.route, append([]scenario.Option{on}, a.except...)...) })
			t.Run("Global", func(t *testing.T) {
				scenario.RunGlobal(t, a.global, append([]scenario.Option{on, notSkipped}, a.exceptGlobal...)...)
			})
			t.Run("Nested", func(t *testing.T) { scenario.RunNested(t, a.nested, on) })
		})
	}
}

// TestScenariosAcross sends keys through two adapters' routers over one
// Redis store, as two replicas of a service in a migration would.
func TestScenariosAcross(t *testing.T) {
	scenario.RunAcross(t, adapters[0].route, adapters[3].route, scenario.OnStore(onRedis(t)))
}
