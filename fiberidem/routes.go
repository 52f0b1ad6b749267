package fiberidem

import (
	"cmp"
	"net/http"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/gofiber/fiber/v3"
	"github.com/idemkit/idem/core"
	"github.com/valyala/fasthttp"
)

// protects reports whether rt protects c's request (method covered; with
// KeyOptional, a key sent in keyHeader, the engine's KeyHeader), asking rt.Protects with a request of c's
// method and, when c carries a key, that header field alone: no copy of
// c's request for one it passes through.
func protects(rt *core.Route, keyHeader string, c fiber.Ctx) bool {
	probe := http.Request{Method: c.Method()}
	if rt.Protects(&probe) {
		return true
	}
	if !hasField(&c.Request().Header, keyHeader) {
		return false
	}
	probe.Header = http.Header{keyHeader: {"?"}}
	return rt.Protects(&probe)
}

// hasField reports whether h has a non-empty field name, whatever the case
// of its name: the engine's view of the request (exchange.request)
// canonicalises the names, so it reads "idempotency-key" as
// "Idempotency-Key", but Peek compares the bytes as sent when the app
// disables Fiber's header normalizing.
func hasField(h *fasthttp.RequestHeader, name string) bool {
	if len(h.Peek(name)) > 0 {
		return true
	}
	for k, v := range h.All() {
		if len(v) > 0 && len(k) == len(name) && strings.EqualFold(string(k), name) {
			return true
		}
	}
	return false
}

// routeOf returns the pattern of the route that serves c's request, and
// whether one does. Installed on a route, the middleware runs in that
// route's handlers (c.Route()). Installed with Use (the app's or a
// group's), it runs before Fiber has found the route: the app's stack is
// searched, as Fiber's router will search it, for the first route after
// this middleware that matches the method and the path. None: Fiber
// answers 404 or 405 itself, and the request passes through, unless a
// middleware registered after this one runs for the path first: it may
// rewrite the path (or the method) onto a route, so later names it (its
// prefix), and the caller refuses the request instead.
func routeOf(c fiber.Ctx) (pattern string, routed bool, later string) {
	idx := indexOf(c.App())
	cur := c.Route()
	if idx.isRoute(cur) {
		return cur.Path, true, ""
	}
	after, ok := idx.pos[cur]
	if !ok {
		after = -1
	}
	method, path := c.Method(), idx.detectionPath(c.Path())
	if pattern, ok := idx.find(method, path, after); ok {
		return pattern, true, ""
	}
	if _, ok := idx.trailed[cur]; ok {
		return "", false, cur.Path
	}
	later, _ = idx.laterUse(method, path, after)
	return "", false, later
}

// routeIndex is what routeOf needs of an app's stack, built once per app
// (again when routes are added: HandlersCount changes).
type routeIndex struct {
	handlers uint32
	config   fiber.Config
	pos      map[*fiber.Route]int      // every route's position in its method's stack
	routes   map[string][]indexedRoute // by method: the routes (not Use) in stack order
	uses     map[string][]indexedRoute // by method: the routes registered with Use, in stack order
	isUse    map[*fiber.Route]struct{} // routes registered with Use
	// trailed are the routes registered with Use whose handlers hold
	// another handler after a fiberidem layer's: Fiber merges the
	// handlers of consecutive Use calls for one prefix into one route
	// (app.Use(fiberidem.New(e)); app.Use(rewrite.New(...))), so the
	// handler after the layer is not a later route. Which of them is the
	// running layer is not known: from the first layer on (failing closed).
	trailed map[*fiber.Route]struct{}
}

// layerCode is the code pointer of every fiberidem layer's handler (one
// function literal in ToMiddleware), which buildIndex tells the other
// handlers of a route from.
var layerCode atomic.Uintptr

type indexedRoute struct {
	pos    int
	path   string // the pattern: Route.Path
	static string // the pattern as the router compares a path without parameters to it (Use: the prefix)
	params bool   // the pattern has parameters: static is unused
}

func (idx *routeIndex) isRoute(r *fiber.Route) bool {
	if r == nil {
		return false
	}
	_, use := idx.isUse[r]
	_, known := idx.pos[r]
	return known && !use
}

// detectionPath is path (c.Path()) as Fiber's router compares it to the
// routes, but for the case (find compares without it unless the app is
// CaseSensitive): with StrictRouting off, every trailing slash trimmed
// (Fiber's configDependentPaths: "/payments//" is "/payments", "//" is "").
func (idx *routeIndex) detectionPath(path string) string {
	if !idx.config.StrictRouting && len(path) > 1 {
		path = strings.TrimRight(path, "/")
	}
	return path
}

// find returns the pattern of the first route of method after position
// after that matches path, a detectionPath.
func (idx *routeIndex) find(method, path string, after int) (string, bool) {
	for _, r := range idx.routes[method] {
		if r.pos <= after {
			continue
		}
		if !r.params {
			if r.static == path || (!idx.config.CaseSensitive && strings.EqualFold(r.static, path)) {
				return r.path, true
			}
			continue
		}
		if fiber.RoutePatternMatch(path, r.path, idx.config) {
			return r.path, true
		}
	}
	return "", false
}

// laterUse returns the pattern of the first route registered with Use for
// method after position after that runs for path, a detectionPath, as
// Fiber's Route.match matches a prefix: "/" runs for every path, "/api"
// for "/api" and "/api/..."; one with parameters is taken to run for
// every path (failing closed).
func (idx *routeIndex) laterUse(method, path string, after int) (string, bool) {
	for _, r := range idx.uses[method] {
		if r.pos <= after {
			continue
		}
		if r.params || r.static == "/" {
			return r.path, true
		}
		n := len(r.static)
		if len(path) < n || !(path[:n] == r.static || (!idx.config.CaseSensitive && strings.EqualFold(path[:n], r.static))) {
			continue
		}
		if n == len(path) || r.static[n-1] == '/' || path[n] == '/' { // Fiber's hasPartialMatchBoundary
			return r.path, true
		}
	}
	return "", false
}

var indexes sync.Map // *fiber.App → *routeIndex

func indexOf(app *fiber.App) *routeIndex {
	if v, ok := indexes.Load(app); ok {
		if idx := v.(*routeIndex); idx.handlers == app.HandlersCount() {
			return idx
		}
	}
	idx := buildIndex(app)
	indexes.Store(app, idx)
	return idx
}

// buildIndex indexes app's stack. Fiber does not say which routes were
// registered with Use; GetRoutes(true) leaves them out, and its copies
// share their handler slices with the routes of the stack.
func buildIndex(app *fiber.App) *routeIndex {
	cfg := app.Config()
	idx := &routeIndex{
		handlers: app.HandlersCount(),
		config:   cfg,
		pos:      map[*fiber.Route]int{},
		routes:   map[string][]indexedRoute{},
		uses:     map[string][]indexedRoute{},
		isUse:    map[*fiber.Route]struct{}{},
		trailed:  map[*fiber.Route]struct{}{},
	}
	notUse := map[*fiber.Handler]struct{}{}
	for _, r := range app.GetRoutes(true) {
		if len(r.Handlers) > 0 {
			notUse[&r.Handlers[0]] = struct{}{}
		}
	}
	methods := cfg.RequestMethods
	for m, stack := range app.Stack() {
		if m >= len(methods) {
			break
		}
		for i, r := range stack {
			idx.pos[r] = i
			if len(r.Handlers) == 0 { // a mount point: the router skips it
				continue
			}
			ir := indexedRoute{pos: i, path: r.Path, params: strings.ContainsAny(r.Path, ":*+?\\(")}
			if !ir.params {
				// As Fiber's register prepares the pattern (but for the
				// case, which find and laterUse compare without).
				ir.static = idx.detectionPath(cmp.Or(r.Path, "/"))
			}
			if _, ok := notUse[&r.Handlers[0]]; !ok {
				idx.isUse[r] = struct{}{}
				if trailsLayer(r.Handlers) {
					idx.trailed[r] = struct{}{}
				}
				idx.uses[methods[m]] = append(idx.uses[methods[m]], ir)
				continue
			}
			idx.routes[methods[m]] = append(idx.routes[methods[m]], ir)
		}
	}
	return idx
}

// trailsLayer reports whether hs holds a handler that is not a fiberidem
// layer's after the first that is.
func trailsLayer(hs []fiber.Handler) bool {
	code, layer := layerCode.Load(), false
	for _, h := range hs {
		isLayer := reflect.ValueOf(h).Pointer() == code
		if !isLayer && layer {
			return true
		}
		layer = layer || isLayer
	}
	return false
}
