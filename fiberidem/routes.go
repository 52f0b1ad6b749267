package fiberidem

import (
	"net/http"
	"strings"
	"sync"

	"github.com/gofiber/fiber/v3"
	"github.com/idemkit/idem/core"
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
	if len(c.Request().Header.Peek(keyHeader)) == 0 {
		return false
	}
	probe.Header = http.Header{keyHeader: {"?"}}
	return rt.Protects(&probe)
}

// routeOf returns the pattern of the route that serves c's request, and
// whether one does. Installed on a route, the middleware runs in that
// route's handlers (c.Route()). Installed with Use (the app's or a
// group's), it runs before Fiber has found the route: the app's stack is
// searched, as Fiber's router will search it, for the first route after
// this middleware that matches the method and the path. None: Fiber
// answers 404 or 405 itself, and the request passes through.
func routeOf(c fiber.Ctx) (string, bool) {
	idx := indexOf(c.App())
	cur := c.Route()
	if idx.isRoute(cur) {
		return cur.Path, true
	}
	after, ok := idx.pos[cur]
	if !ok {
		after = -1
	}
	return idx.find(c.Method(), c.Path(), after)
}

// routeIndex is what routeOf needs of an app's stack, built once per app
// (again when routes are added: HandlersCount changes).
type routeIndex struct {
	handlers uint32
	config   fiber.Config
	pos      map[*fiber.Route]int      // every route's position in its method's stack
	routes   map[string][]indexedRoute // by method: the routes (not Use) in stack order
	isUse    map[*fiber.Route]struct{} // routes registered with Use
}

type indexedRoute struct {
	pos    int
	path   string // the pattern: Route.Path
	static string // the pattern as the router compares a path without parameters to it; "" when it has parameters
}

func (idx *routeIndex) isRoute(r *fiber.Route) bool {
	if r == nil {
		return false
	}
	_, use := idx.isUse[r]
	_, known := idx.pos[r]
	return known && !use
}

// find returns the pattern of the first route of method after position
// after that matches path.
func (idx *routeIndex) find(method, path string, after int) (string, bool) {
	if !idx.config.StrictRouting && len(path) > 1 {
		path = strings.TrimSuffix(path, "/")
	}
	for _, r := range idx.routes[method] {
		if r.pos <= after {
			continue
		}
		if r.static != "" {
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
		isUse:    map[*fiber.Route]struct{}{},
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
			if len(r.Handlers) == 0 {
				continue
			}
			if _, ok := notUse[&r.Handlers[0]]; !ok {
				idx.isUse[r] = struct{}{}
				continue
			}
			ir := indexedRoute{pos: i, path: r.Path}
			if !strings.ContainsAny(r.Path, ":*+?\\(") {
				ir.static = r.Path
				if !cfg.StrictRouting && len(ir.static) > 1 {
					ir.static = strings.TrimSuffix(ir.static, "/")
				}
				if ir.static == "" {
					ir.static = "/"
				}
			}
			idx.routes[methods[m]] = append(idx.routes[methods[m]], ir)
		}
	}
	return idx
}
