package scenario_test

import (
	"net/http"
	"testing"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/scenario"
)

// netHTTP serves the routes on a ServeMux, each wrapped with
// core.Engine.Handler: the decisions are labelled with Request.Pattern,
// which the mux sets before it calls the wrapped handler.
// A route marked Skip is registered unwrapped (a global install's skip).
func netHTTP(t *testing.T, e *core.Engine, routes []scenario.Route) http.Handler {
	mux := http.NewServeMux()
	for _, rt := range routes {
		if rt.Skip {
			mux.Handle(rt.Method+" "+rt.Pattern, rt.Handler)
			continue
		}
		mux.Handle(rt.Method+" "+rt.Pattern, e.Handler(rt.Handler, rt.Options...))
	}
	return mux
}

func TestNetHTTP(t *testing.T) { scenario.Run(t, netHTTP) }

// TestNetHTTPGlobal runs the global scenarios. A ServeMux sets
// Request.Pattern only after routing, so a plain middleware around the
// whole mux would see no pattern (and could not leave the mux's own 404
// and 405 alone); the idiomatic net/http equivalent of r.Use is to wrap
// every route's handler with the same options, which is what netHTTP does
// (the routes carry none).
func TestNetHTTPGlobal(t *testing.T) { scenario.RunGlobal(t, netHTTP) }

// netHTTPMux wraps the whole ServeMux once, as r.Use would: the engine
// asks the mux before it routes whether it answers itself, and for the
// pattern (the label). The routes marked Skip are served by a mux in
// front of it, which passes every other request on.
func netHTTPMux(t *testing.T, e *core.Engine, routes []scenario.Route) http.Handler {
	mux, front := http.NewServeMux(), http.NewServeMux()
	for _, rt := range routes {
		if rt.Skip {
			front.Handle(rt.Method+" "+rt.Pattern, rt.Handler)
			continue
		}
		mux.Handle(rt.Method+" "+rt.Pattern, rt.Handler)
	}
	front.Handle("/", e.Handler(mux))
	return front
}

func TestNetHTTPGlobalMux(t *testing.T) { scenario.RunGlobal(t, netHTTPMux) }

// TestNetHTTPRecovered puts an application's own recovery handler around
// the protected mux.
func TestNetHTTPRecovered(t *testing.T) {
	scenario.RunRecovered(t, func(t *testing.T, e *core.Engine, routes []scenario.Route) http.Handler {
		h := netHTTPMux(t, e, routes)
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			defer func() {
				if v := recover(); v != nil {
					http.Error(w, "recovered by the application", http.StatusInternalServerError)
				}
			}()
			h.ServeHTTP(w, r)
		})
	})
}

// TestNetHTTPNestedMux wraps the whole ServeMux and, again, every route
// with its options.
func TestNetHTTPNestedMux(t *testing.T) {
	scenario.RunNested(t, func(t *testing.T, e *core.Engine, routes []scenario.Route) http.Handler {
		mux := http.NewServeMux()
		for _, rt := range routes {
			mux.Handle(rt.Method+" "+rt.Pattern, e.Handler(rt.Handler, rt.Options...))
		}
		return e.Handler(mux)
	})
}

// TestNetHTTPNested wraps every route's handler twice: with no options
// (the "global" wrap) around the route's own options.
func TestNetHTTPNested(t *testing.T) {
	scenario.RunNested(t, func(t *testing.T, e *core.Engine, routes []scenario.Route) http.Handler {
		mux := http.NewServeMux()
		for _, rt := range routes {
			mux.Handle(rt.Method+" "+rt.Pattern, e.Handler(e.Handler(rt.Handler, rt.Options...)))
		}
		return mux
	})
}

// TestNetHTTPWithin serves every route with core.Route.Within, in a
// transaction the handler's service opens itself (scenario.StoreTx).
func TestNetHTTPWithin(t *testing.T) {
	scenario.RunWithin(t, func(t *testing.T, e *core.Engine, routes []scenario.Route) http.Handler {
		mux := http.NewServeMux()
		inTx := scenario.StoreTx(e)
		for _, rt := range routes {
			route := e.Route(rt.Options...)
			mux.HandleFunc(rt.Method+" "+rt.Pattern, func(w http.ResponseWriter, r *http.Request) {
				route.Within(w, r, inTx, rt.Handler)
			})
		}
		return mux
	})
}

// TestNetHTTPAcross runs the cross-router scenarios with two ServeMux
// replicas on one store (the renamed-parameter scenario spells the route
// two ways).
func TestNetHTTPAcross(t *testing.T) { scenario.RunAcross(t, netHTTP, netHTTP) }
