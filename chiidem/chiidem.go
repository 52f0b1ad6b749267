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
// A record is (caller, scope, key), the scope empty unless a core.Scope
// option names one: the route is never part of it, so the same key on
// another route (or another order's path) is a key reused for another
// request, 422, and a request keeps its identity when the service moves
// to another router or renames a path parameter. Requests that match no
// route (404, 405) pass through untouched: a middleware installed with
// Use runs before its router routes the request, so it asks that router's
// tree in advance whether the request reaches a route (chi.Routes.Find on
// the path it will route, after the path rewriting of the middleware
// before it: middleware.StripSlashes, URLFormat, CleanPath). A request
// that one of chi's rewriting middlewares installed AFTER this one would
// route to a handler is refused with a 500 problem (fail closed, logged
// with the fix: install chiidem after it), never passed through. The
// route pattern found ("/orders/{id}/refunds", the same whether the
// middleware is installed globally, in a sub-router or per route; a
// non-chi handler mounted with Mount: "/legacy/*"; outside a chi router,
// Request.Pattern's) labels the decisions for observability
// (core.Event.Route); it is never the concrete path and never part of the
// identity. Handlers reach the engine's context (in atomic mode the
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
	routed         result = iota // the request reaches a route (or is not under chi)
	notRouted                    // no route matches: the router answers itself
	rewrittenLater               // a route matches only after a rewriting middleware that runs later
)

var searches = sync.Pool{New: func() any { return chi.NewRouteContext() }}

// routePattern returns the pattern of the route that serves r, and
// whether chi routes r to a handler at all (notRouted: chi answers 404 or
// 405 itself, which passes through untouched) or only after a rewriting
// middleware installed later (refused). The pattern labels the decisions
// (core.Event.Route); it is not part of the identity.
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
		return "", routed // not under chi: core labels with Request.Pattern
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
	// Not found. Would chi's rewriting middlewares installed after this
	// one (in this router, or in a router the request goes on to) route
	// it, alone or one after another? (Had they run before, the routing
	// path would be rewritten already.)
	if p := findRewritten(s, routes, r.Method, routePath, 0); p != "" {
		return normalise(s, prefix+p), rewrittenLater
	}
	return "", notRouted
}

// findRewritten returns the pattern of a route that path reaches after
// a sequence of the rewriters not in used (a bit set of rewriters already
// applied), every one of them installed in routes or in a router the
// search goes on to, or "". There are three rewriters, so at most 15
// sequences are tried, and only for a request that matched no route.
func findRewritten(s *chi.Context, routes chi.Routes, method, path string, used int) string {
	for i, rw := range rewriters {
		if used&(1<<i) != 0 {
			continue
		}
		q := rw.rewrite(path)
		if q == path {
			continue
		}
		seq := used | 1<<i
		if p := find(s, routes, method, q); p != "" && allInstalled(routes, s.RoutePatterns, seq) {
			return p
		}
		if p := findRewritten(s, routes, method, q, seq); p != "" {
			return p
		}
	}
	return ""
}

// allInstalled reports whether every rewriter in the bit set seq is
// installed (see installed).
func allInstalled(routes chi.Routes, patterns []string, seq int) bool {
	for i, rw := range rewriters {
		if seq&(1<<i) != 0 && !installed(routes, patterns, rw.fn) {
			return false
		}
	}
	return true
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
