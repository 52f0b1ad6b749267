package chiidem_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/go-chi/chi/v5/middleware"
	"github.com/idemkit/idem/chiidem"
	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/scenario"
)

func TestScenarios(t *testing.T) {
	scenario.Run(t, func(t *testing.T, e *core.Engine, routes []scenario.Route) http.Handler {
		r := chi.NewRouter() // no recovery: panics must reach the suite
		for _, rt := range routes {
			r.With(chiidem.New(e, rt.Options...)).MethodFunc(rt.Method, rt.Pattern, rt.Handler)
		}
		return r
	})
}

// global installs the middleware with r.Use, where it runs before chi
// routes the request, behind the middleware before; Config.Skipper skips
// the routes marked Skip (it sees the request before routing: it asks a
// router of the skipped routes).
func global(e *core.Engine, routes []scenario.Route, before ...func(http.Handler) http.Handler) http.Handler {
	skipped := chi.NewRouter()
	for _, rt := range routes {
		if rt.Skip {
			skipped.MethodFunc(rt.Method, rt.Pattern, rt.Handler)
		}
	}
	r := chi.NewRouter()
	r.Use(before...)
	r.Use(chiidem.NewWithConfig(chiidem.Config{Engine: e, Skipper: func(r *http.Request) bool {
		return skipped.Match(chi.NewRouteContext(), r.Method, r.URL.Path)
	}}))
	for _, rt := range routes {
		r.MethodFunc(rt.Method, rt.Pattern, rt.Handler)
	}
	return r
}

func TestScenariosGlobal(t *testing.T) {
	scenario.RunGlobal(t, func(t *testing.T, e *core.Engine, routes []scenario.Route) http.Handler {
		return global(e, routes)
	})
}

// TestScenariosRecovered: middleware.Recoverer before the middleware
// answers a handler's panic inside the router.
func TestScenariosRecovered(t *testing.T) {
	scenario.RunRecovered(t, func(t *testing.T, e *core.Engine, routes []scenario.Route) http.Handler {
		return global(e, routes, quietRecoverer)
	})
}

// quietRecoverer is chi's Recoverer with a log entry that prints no stack.
func quietRecoverer(next http.Handler) http.Handler {
	rec := middleware.Recoverer(next)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec.ServeHTTP(w, middleware.WithLogEntry(r, quietEntry{}))
	})
}

type quietEntry struct{}

func (quietEntry) Write(int, int, http.Header, time.Duration, any) {}
func (quietEntry) Panic(any, []byte)                               {}

func TestScenariosNested(t *testing.T) {
	scenario.RunNested(t, func(t *testing.T, e *core.Engine, routes []scenario.Route) http.Handler {
		r := chi.NewRouter()
		r.Use(chiidem.New(e))
		for _, rt := range routes {
			r.With(chiidem.New(e, rt.Options...)).MethodFunc(rt.Method, rt.Pattern, rt.Handler)
		}
		return r
	})
}

// TestScenariosWithinRoute serves every route with core.Route.Within
// called from a chi handler, in a transaction the service opens
// (scenario.StoreTx).
func TestScenariosWithinRoute(t *testing.T) {
	scenario.RunWithin(t, func(t *testing.T, e *core.Engine, routes []scenario.Route) http.Handler {
		r := chi.NewRouter()
		inTx := scenario.StoreTx(e)
		for _, rt := range routes {
			route := e.Route(rt.Options...)
			r.MethodFunc(rt.Method, rt.Pattern, func(w http.ResponseWriter, r *http.Request) {
				route.Within(w, r, inTx, rt.Handler)
			})
		}
		return r
	})
}
