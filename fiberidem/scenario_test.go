package fiberidem_test

import (
	"net/http"
	"testing"

	"github.com/gofiber/fiber/v3"
	fiberrecover "github.com/gofiber/fiber/v3/middleware/recover"
	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/scenario"
	"github.com/idemkit/idem/fiberidem"
)

// notFiber are the scenarios of net/http features Fiber does not have,
// each with the reason; README.md says what a Fiber service gets instead.
var notFiber = []scenario.Option{
	scenario.Except("fasthttp reads the whole body before any handler runs: a Fiber middleware cannot consume it (c.Body() is a buffer), and a net/http one in front of the bridge hands Fiber an empty body",
		"BodyConsumedUpstream"),
	scenario.Except("Fiber has no synchronous Hijack: fasthttp hands the connection over only after the handler returned (c.RequestCtx().Hijack)",
		"LeasedHijack"),
	scenario.Except("Fiber holds an answer whole in memory (fasthttp's response buffer): the engine spills what it records past the cap, but delivers into that buffer",
		"AtomicSpillPastCap"),
	scenario.Except("an application's own body limit in front of Fiber is Fiber's BodyLimit, which fasthttp enforces with its own 413 before any handler runs",
		"UpstreamBodyLimit"),
}

func TestScenarios(t *testing.T) {
	scenario.Run(t, perRoute, notFiber...)
}

// notFiberGlobal are the global scenarios Fiber cannot express.
var notFiberGlobal = scenario.Except("fasthttp reads the whole body before any handler runs: a Fiber middleware cannot consume it (c.Body() is a buffer), and a net/http one in front of the bridge hands Fiber an empty body",
	"BodyConsumedUpstream")

// global installs the middleware with app.Use, behind the handlers
// before; Config.Next skips the routes marked Skip (it runs before the
// route is known: it matches the path against their patterns).
func global(e *core.Engine, routes []scenario.Route, before ...any) http.Handler {
	var skipped []string
	for _, rt := range routes {
		if rt.Skip {
			skipped = append(skipped, fiberPattern(rt.Pattern))
		}
	}
	app := newApp()
	for _, h := range before {
		app.Use(h)
	}
	app.Use(fiberidem.NewWithConfig(fiberidem.Config{Engine: e, Next: func(c fiber.Ctx) bool {
		for _, p := range skipped {
			if fiber.RoutePatternMatch(c.Path(), p) {
				return true
			}
		}
		return false
	}}))
	for _, rt := range routes {
		app.Add([]string{rt.Method}, fiberPattern(rt.Pattern), handler(rt.Handler))
	}
	return serve(app)
}

func TestScenariosGlobal(t *testing.T) {
	scenario.RunGlobal(t, func(t *testing.T, e *core.Engine, routes []scenario.Route) http.Handler {
		return global(e, routes)
	}, notFiberGlobal)
}

// TestScenariosRecovered: Fiber's recover middleware before the
// middleware answers a handler's panic inside the app.
func TestScenariosRecovered(t *testing.T) {
	scenario.RunRecovered(t, func(t *testing.T, e *core.Engine, routes []scenario.Route) http.Handler {
		return global(e, routes, fiberrecover.New())
	})
}

func TestScenariosNested(t *testing.T) {
	scenario.RunNested(t, func(t *testing.T, e *core.Engine, routes []scenario.Route) http.Handler {
		app := newApp()
		app.Use(fiberidem.New(e))
		for _, rt := range routes {
			app.Add([]string{rt.Method}, fiberPattern(rt.Pattern), fiberidem.New(e, rt.Options...), handler(rt.Handler))
		}
		return serve(app)
	})
}

// TestScenariosWithin serves every route with fiberidem.Within, in a
// transaction the service opens (scenario.StoreTx).
func TestScenariosWithin(t *testing.T) {
	scenario.RunWithin(t, func(t *testing.T, e *core.Engine, routes []scenario.Route) http.Handler {
		app := newApp()
		inTx := scenario.StoreTx(e)
		for _, rt := range routes {
			route := e.Route(rt.Options...)
			h := handler(rt.Handler)
			app.Add([]string{rt.Method}, fiberPattern(rt.Pattern), func(c fiber.Ctx) error {
				return fiberidem.Within(c, route, inTx, h)
			})
		}
		return serve(app)
	})
}

// perRoute is the factory of TestScenarios, for RunAcross.
func perRoute(t *testing.T, e *core.Engine, routes []scenario.Route) http.Handler {
	app := newApp()
	for _, rt := range routes {
		app.Add([]string{rt.Method}, fiberPattern(rt.Pattern), fiberidem.New(e, rt.Options...), handler(rt.Handler))
	}
	return serve(app)
}

// netHTTP serves the routes with core's own net/http middleware.
func netHTTP(t *testing.T, e *core.Engine, routes []scenario.Route) http.Handler {
	mux := http.NewServeMux()
	for _, rt := range routes {
		mux.Handle(rt.Method+" "+rt.Pattern, e.Handler(rt.Handler, rt.Options...))
	}
	return mux
}

// TestScenariosAcross sends one key through two Fiber replicas, and
// through a Fiber replica and a net/http one, on one store.
func TestScenariosAcross(t *testing.T) {
	t.Run("fiber-fiber", func(t *testing.T) { scenario.RunAcross(t, perRoute, perRoute) })
	t.Run("fiber-nethttp", func(t *testing.T) { scenario.RunAcross(t, perRoute, netHTTP) })
}
