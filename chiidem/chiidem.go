package chiidem

import (
	"cmp"
	"fmt"
	"net/http"
	"path"
	"reflect"
	"strings"

	"github.com/go-chi/chi/v5"
	"github.com/go-chi/chi/v5/middleware"
	"github.com/idemkit/idem/core"
)

// New returns chi middleware that protects the requests it sees with e and
// the route options opts, installed globally, in a sub-router or on one
// route (see the package documentation). It panics with an error wrapping
// core.ErrConfig when e is nil.
func New(e *core.Engine, opts ...core.RouteOption) func(http.Handler) http.Handler {
	return NewWithConfig(Config{Engine: e, Options: opts})
}

// Config configures the middleware.
type Config struct {
	// Engine is the idempotency engine. Required.
	Engine *core.Engine
	// Skipper selects requests that pass through unprotected (default:
	// none), as middleware.Maybe's; it runs before routing (method, path).
	Skipper func(r *http.Request) bool
	// Options are the route options over the engine's defaults (default: none).
	Options []core.RouteOption
}

// NewWithConfig is New with a Config; it panics with an error wrapping
// core.ErrConfig on an invalid configuration (Config.ToMiddleware returns it).
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
	skip, rt := config.Skipper, config.Engine.Route(config.Options...)
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if skip != nil && skip(r) {
				next.ServeHTTP(w, r)
				return
			}
			pattern, reached := "", true
			if rt.Protects(r) { // else Serve passes it through
				pattern, reached = route(r)
			}
			switch {
			case !reached && pattern == "":
				next.ServeHTTP(w, r) // chi answers 404 or 405 itself
			case !reached:
				rt.Refuse(w, r, fmt.Errorf("%w: chiidem: %s %s reaches a route (%s) only after a path-rewriting middleware that runs after chiidem; install chiidem after middleware.StripSlashes, URLFormat and CleanPath",
					core.ErrNotProtected, r.Method, r.URL.Path, pattern))
			default:
				rt.Serve(w, r, pattern, nil, next.ServeHTTP)
			}
		})
	}, nil
}

// route returns the pattern of the route chi routes r to, reached false
// when chi answers r itself (pattern "") or reaches a route only after a
// rewriter installed later (its pattern). Before routing it searches the
// tree of the router it runs in (the mounts in RoutePatterns, followed from
// the root) with the path that router routes (RoutePath); after routing
// (per route) chi's own pattern is the answer.
func route(r *http.Request) (pattern string, reached bool) {
	rctx := chi.RouteContext(r.Context())
	if rctx == nil || rctx.Routes == nil {
		return "", true // not under chi: core labels with Request.Pattern
	}
	routes, prefix := rctx.Routes, ""
	for _, p := range rctx.RoutePatterns {
		if routes = mounted(routes, p); routes == nil {
			return rctx.RoutePattern(), true // routing is over
		}
		prefix += strings.TrimSuffix(p, "/*")
	}
	routePath := cmp.Or(rctx.RoutePath, r.URL.RawPath, r.URL.Path, "/")
	s := chi.NewRouteContext()
	if p := routes.Find(s, r.Method, routePath); p != "" {
		return label(s, prefix+p), true
	}
	if p := rewritten(s, routes, r.Method, routePath, 0); p != "" {
		return label(s, prefix+p), false
	}
	return "", false
}

// rewritten returns the pattern of a route path reaches after chi's
// rewriters not in the bit set used, one after another, each installed
// along the way; or "". At most 15 sequences, only when no route matched.
func rewritten(s *chi.Context, routes chi.Routes, method, path string, used int) string {
	for i, rw := range rewriters {
		q := rw.rewrite(path)
		if used&(1<<i) != 0 || q == path {
			continue
		}
		seq := used | 1<<i
		s.Reset()
		if p := routes.Find(s, method, q); p != "" && installed(routes, s.RoutePatterns, seq) {
			return p
		}
		if p := rewritten(s, routes, method, q, seq); p != "" {
			return p
		}
	}
	return ""
}

// installed reports whether every rewriter in the bit set seq is installed
// in routes or in a router mounted along patterns.
func installed(routes chi.Routes, patterns []string, seq int) bool {
	have := 0
	for routes != nil {
		for _, mw := range routes.Middlewares() {
			for i, rw := range rewriters {
				if reflect.ValueOf(mw).Pointer() == rw.fn {
					have |= 1 << i
				}
			}
		}
		if len(patterns) == 0 {
			break
		}
		routes, patterns = mounted(routes, patterns[0]), patterns[1:]
	}
	return have&seq == seq
}

// label joins p as chi's RoutePattern does ("/api/" → "/api").
func label(s *chi.Context, p string) string {
	s.Reset()
	s.RoutePatterns = append(s.RoutePatterns, p)
	return s.RoutePattern()
}

// mounted returns the chi router mounted at pattern in routes, or nil.
func mounted(routes chi.Routes, pattern string) chi.Routes {
	if !strings.HasSuffix(pattern, "/*") {
		return nil
	}
	for _, rt := range routes.Routes() {
		if rt.Pattern == pattern && rt.SubRoutes != nil {
			return rt.SubRoutes
		}
	}
	return nil
}

// rewriters are chi's path-rewriting middlewares and what each does.
var rewriters = []struct {
	fn      uintptr
	rewrite func(string) string
}{
	{reflect.ValueOf(middleware.StripSlashes).Pointer(), func(p string) string {
		if len(p) > 1 {
			return strings.TrimSuffix(p, "/")
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
