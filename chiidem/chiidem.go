package chiidem

import (
	"fmt"
	"net/http"
	"path"
	"reflect"
	"strings"
	"sync"

	"github.com/go-chi/chi/v5"
	"github.com/go-chi/chi/v5/middleware"
	"github.com/idemkit/idem/core"
)

// New returns chi middleware that protects the requests it sees with e and
// the route options opts (core.Scope, core.Retention, core.Leased, ...).
// Install it globally (r.Use(chiidem.New(e))), in a group or sub-router, or
// on one route (r.With(chiidem.New(e)).Post(...)). Installed both globally
// and on a route, the two run as one layer with the route's options (the
// inner layer takes the request over). To leave requests out of a global
// install, use NewWithConfig with a Skipper.
//
// The scope defaults to the method and chi's route pattern
// ("POST /orders/{id}/refunds"), so every order shares one scope. A
// middleware installed with Use runs before its router routes the
// request, so the pattern is looked up in advance in that router's tree
// (chi.Routes.Find on the path it will route, after the path rewriting of
// the middleware before it: middleware.StripSlashes, URLFormat,
// CleanPath); the scope is the same whether the middleware is installed
// globally, in a sub-router or per route. A non-chi handler mounted with
// Mount is protected under the mount's pattern ("POST /legacy/*").
// Requests that match no route (404, 405) pass through untouched. A
// request that one of chi's rewriting middlewares installed AFTER this one
// would route to a handler is refused with a 500 problem (fail closed,
// logged with the fix: install chiidem after it), never passed through.
// Outside a chi router the scope falls back to Request.Pattern, then the
// path. Handlers reach the engine's context (in atomic mode the
// transaction: sqlstore.Tx(r.Context()), gormstore.DB(r.Context()))
// from their request; callers are named with core.WithCaller reading
// r.Context().
//
// New panics with an error wrapping core.ErrConfig when e is nil.
func New(e *core.Engine, opts ...core.RouteOption) func(http.Handler) http.Handler {
	return NewWithConfig(Config{Engine: e, Options: opts})
}

// Config configures the middleware.
type Config struct {
	// Engine is the idempotency engine. Required.
	Engine *core.Engine
	// Skipper selects requests that pass through unprotected (default:
	// none), as middleware.Maybe's function does. A middleware installed
	// with Use runs before chi routes the request, so the Skipper sees the
	// request (method, path), not the route pattern:
	//
	//	Skipper: func(r *http.Request) bool { return strings.HasPrefix(r.URL.Path, "/webhooks/") }
	Skipper func(r *http.Request) bool
	// Options are the route options (core.Scope, core.Retention,
	// core.Leased, ...) over the engine's defaults (default: none).
	Options []core.RouteOption
}

// NewWithConfig is New with a Config; it panics with an error wrapping
// core.ErrConfig on an invalid configuration (see Config.ToMiddleware for
// the error instead).
func NewWithConfig(config Config) func(http.Handler) http.Handler {
	mw, err := config.ToMiddleware()
	if err != nil {
		panic(err)
	}
	return mw
}

// ToMiddleware returns the middleware, or an error wrapping core.ErrConfig
// when the configuration is invalid.
func (config Config) ToMiddleware() (func(http.Handler) http.Handler, error) {
	if config.Engine == nil {
		return nil, fmt.Errorf("%w: chiidem: Config.Engine is nil", core.ErrConfig)
	}
	skip := config.Skipper
	rt := config.Engine.Route(config.Options...)
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if skip != nil && skip(r) {
				next.ServeHTTP(w, r)
				return
			}
			if !rt.Protects(r) {
				// Passes through (Serve takes it over from an outer layer,
				// as a nested layer does); no need to look the route up.
				rt.Serve(w, r, "", nil, next.ServeHTTP)
				return
			}
			pattern, res := routePattern(r)
			switch res {
			case notRouted:
				next.ServeHTTP(w, r) // the router answers 404 or 405 itself
				return
			case rewrittenLater:
				rt.Refuse(w, r, fmt.Errorf("%w: chiidem: %s %s reaches a route (%s) only after a path-rewriting middleware that runs after chiidem; install chiidem after middleware.StripSlashes, URLFormat and CleanPath",
					core.ErrNotProtected, r.Method, r.URL.Path, pattern))
				return
			}
			rt.Serve(w, r, pattern, nil, next.ServeHTTP)
		})
	}, nil
}

// result says how routePattern ended.
type result int

const (
	routed         result = iota // the pattern is known (or not under chi)
	notRouted                    // no route matches: the router answers itself
	rewrittenLater               // a route matches only after a rewriting middleware that runs later
)

var searches = sync.Pool{New: func() any { return chi.NewRouteContext() }}

// routePattern returns the pattern of the route that serves r.
//
// chi's route context says where routing stands: RoutePatterns holds the
// patterns matched so far (the mounts the request went through, and the
// route's own pattern once routing is over: per-route use), and RoutePath
// the path the current router routes (set by a mount, or by a rewriting
// middleware). The router the middleware runs in is found by following
// the mounts from the root (rctx.Routes); its tree is searched with its
// routing path, so the path rewriting of the middleware that ran before is
// taken into account.
func routePattern(r *http.Request) (string, result) {
	rctx := chi.RouteContext(r.Context())
	if rctx == nil || rctx.Routes == nil {
		return "", routed // not under chi: core uses Request.Pattern or the path
	}
	routes := rctx.Routes
	prefix := ""
	for _, p := range rctx.RoutePatterns {
		sub := mounted(routes, p)
		if sub == nil {
			// Routing is over: the route's own pattern (per-route use), or
			// a mounted non-chi handler, whose requests share the mount's
			// pattern ("/legacy/*").
			return rctx.RoutePattern(), routed
		}
		routes = sub
		prefix += strings.TrimSuffix(p, "/*")
	}
	routePath := rctx.RoutePath
	if routePath == "" {
		routePath = r.URL.RawPath
		if routePath == "" {
			routePath = r.URL.Path
		}
		if routePath == "" {
			routePath = "/"
		}
	}
	s := searches.Get().(*chi.Context)
	defer searches.Put(s)
	if p := find(s, routes, r.Method, routePath); p != "" {
		return normalise(s, prefix+p), routed
	}
	// Not found. Would one of chi's rewriting middlewares, installed after
	// this one (in this router, or in a router the request goes on to),
	// route it? (Had it run before, the routing path would be rewritten
	// already.)
	for _, rw := range rewriters {
		q := rw.rewrite(routePath)
		if q == routePath {
			continue
		}
		p := find(s, routes, r.Method, q)
		if p == "" {
			continue
		}
		if installed(routes, s.RoutePatterns, rw.fn) {
			return normalise(s, prefix+p), rewrittenLater
		}
	}
	return "", notRouted
}

// installed reports whether the middleware at address fn is installed in
// routes or in a router mounted along patterns (what a search from routes
// matched).
func installed(routes chi.Routes, patterns []string, fn uintptr) bool {
	for {
		for _, mw := range routes.Middlewares() {
			if reflect.ValueOf(mw).Pointer() == fn {
				return true
			}
		}
		if len(patterns) == 0 {
			return false
		}
		if routes = mounted(routes, patterns[0]); routes == nil {
			return false
		}
		patterns = patterns[1:]
	}
}

func find(s *chi.Context, routes chi.Routes, method, path string) string {
	s.Reset()
	return routes.Find(s, method, path)
}

// normalise joins the pattern as chi's RoutePattern does, so per-route and
// global use agree ("/api/" of a sub-router's root route becomes "/api").
func normalise(s *chi.Context, p string) string {
	s.Reset()
	s.RoutePatterns = append(s.RoutePatterns, p)
	return s.RoutePattern()
}

// mounts caches, per router and pattern, the router mounted there (nil:
// none, the pattern is a route's or a non-chi handler's).
var mounts sync.Map // mountKey → chi.Routes (nil interface for none)

type mountKey struct {
	routes  chi.Routes
	pattern string
}

// mounted returns the chi router mounted at pattern in routes, or nil.
func mounted(routes chi.Routes, pattern string) chi.Routes {
	if !strings.HasSuffix(pattern, "/*") {
		return nil
	}
	k := mountKey{routes, pattern}
	if v, ok := mounts.Load(k); ok {
		sub, _ := v.(chi.Routes)
		return sub
	}
	var sub chi.Routes
	for _, rt := range routes.Routes() {
		if rt.Pattern == pattern && rt.SubRoutes != nil {
			sub = rt.SubRoutes
			break
		}
	}
	mounts.Store(k, sub)
	return sub
}

// rewriters are chi's middlewares that rewrite the routing path: the
// function's address, and what it does to a path.
var rewriters = []struct {
	fn      uintptr
	rewrite func(string) string
}{
	{reflect.ValueOf(middleware.StripSlashes).Pointer(), func(p string) string {
		if len(p) > 1 && p[len(p)-1] == '/' {
			return p[:len(p)-1]
		}
		return p
	}},
	{reflect.ValueOf(middleware.CleanPath).Pointer(), path.Clean},
	{reflect.ValueOf(middleware.URLFormat).Pointer(), func(p string) string {
		if strings.Index(p, ".") > 0 {
			base := strings.LastIndex(p, "/")
			if idx := strings.LastIndex(p[base:], "."); idx > 0 {
				return p[:base+idx]
			}
		}
		return p
	}},
}
