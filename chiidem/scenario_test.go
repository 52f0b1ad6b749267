package chiidem_test

import (
	"net/http"
	"testing"

	"github.com/go-chi/chi/v5"
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

// TestScenariosGlobal installs the middleware with r.Use, where it runs
// before chi routes the request.
func TestScenariosGlobal(t *testing.T) {
	scenario.RunGlobal(t, func(t *testing.T, e *core.Engine, routes []scenario.Route) http.Handler {
		r := chi.NewRouter()
		r.Use(chiidem.New(e))
		for _, rt := range routes {
			r.MethodFunc(rt.Method, rt.Pattern, rt.Handler)
		}
		return r
	})
}

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
