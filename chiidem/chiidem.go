package chiidem

import (
	"fmt"
	"net/http"
	"strings"
	"sync"

	"github.com/go-chi/chi/v5"
	"github.com/idemkit/idem/core"
)

// New returns chi middleware that protects the requests it sees with e and
// the route options opts (core.Scope, core.Retention, core.Leased, ...).
// Install it globally (r.Use(chiidem.New(e))), in a group or sub-router, or
// on one route (r.With(chiidem.New(e)).Post(...)).
//
// The scope defaults to the method and chi's route pattern
// ("POST /orders/{id}/refunds"), so every order shares one scope. A
// middleware installed with Use runs before chi routes the request, so the
// pattern is looked up in advance in the router tree (chi.Routes.Find); the
// scope is the same whether the middleware is installed globally or per
// route. Requests that match no route (404, 405) pass through untouched.
// Outside a chi router the scope falls back to Request.Pattern, then the
// path. Handlers reach the engine's context (in atomic mode the
// transaction: sqlstore.Tx(r.Context()), gormstore.DB(r.Context()))
// from their request; callers are named with core.WithCaller reading
// r.Context().
//
// New panics with an error wrapping core.ErrConfig when e is nil.
func New(e *core.Engine, opts ...core.RouteOption) func(http.Handler) http.Handler {
	if e == nil {
		panic(fmt.Errorf("%w: chiidem.New: nil engine", core.ErrConfig))
	}
	rt := e.Route(opts...)
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if !rt.Protects(r) { // passes through: no need to look the route up
				next.ServeHTTP(w, r)
				return
			}
			pattern, ok := routePattern(r)
			if !ok {
				next.ServeHTTP(w, r)
				return
			}
			rt.Serve(w, r, pattern, nil, next.ServeHTTP)
		})
	}
}

var searches = sync.Pool{New: func() any { return chi.NewRouteContext() }}

// routePattern returns the pattern of the route that serves r, and false
// when r is under a chi router but matches no route.
func routePattern(r *http.Request) (string, bool) {
	rctx := chi.RouteContext(r.Context())
	if rctx == nil || rctx.Routes == nil {
		return "", true // not under chi: core uses Request.Pattern or the path
	}
	// rctx.Routes is the root router, even inside sub-routers, so the
	// search starts from the path the root routes: its override (set by
	// middleware such as middleware.URLFormat) or the request's full path.
	path := rctx.RoutePath
	if path == "" || len(rctx.RoutePatterns) > 0 {
		path = r.URL.RawPath
	}
	if path == "" {
		path = r.URL.Path
	}
	if path == "" {
		path = "/"
	}
	s := searches.Get().(*chi.Context)
	defer searches.Put(s)
	s.Reset()
	if p := rctx.Routes.Find(s, r.Method, path); p != "" {
		// Normalise as chi's RoutePattern does, so per-route and global use
		// agree ("/api/" of a sub-router's root route becomes "/api").
		s.Reset()
		s.RoutePatterns = append(s.RoutePatterns, p)
		return s.RoutePattern(), true
	}
	// Not found from the root: no route matches, or a routing override
	// (RoutePath) is in play. After routing (per-route use) chi knows the
	// pattern; a pattern that still ends at a mount point ("/api/*") means
	// routing is not finished and found nothing.
	p := rctx.RoutePattern()
	return p, p != "" && !strings.HasSuffix(p, "*")
}
