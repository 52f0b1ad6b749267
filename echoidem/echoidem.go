package echoidem

import (
	"fmt"
	"net/http"
	"reflect"
	"sync"

	"github.com/idemkit/idem/core"
	"github.com/labstack/echo/v4"
	"github.com/labstack/echo/v4/middleware"
)

// Config configures the middleware.
type Config struct {
	// Engine is the idempotency engine. Required.
	Engine *core.Engine
	// Skipper selects requests that pass through unprotected (default:
	// none, middleware.DefaultSkipper).
	Skipper middleware.Skipper
	// Options are the route options (core.Scope, core.Retention,
	// core.Leased, ...) over the engine's defaults (default: none).
	Options []core.RouteOption
}

// New returns Echo middleware that protects the requests it sees with e and
// the route options opts. Install it globally (e.Use(echoidem.New(eng))),
// on a group, or on one route. Installed with e.Pre it runs before
// routing and refuses every request of a covered method (500
// not-protected, logged with the fix).
//
// A record is (caller, scope, key), the scope empty unless a core.Scope
// option names one: the route is never part of it, so the same key on
// another route (or another order's path) is a key reused for another
// request, 422, and a request keeps its identity under another router or
// a renamed path parameter. c.Path(), the route pattern
// ("/orders/:id/refunds"), labels the decisions for observability
// (core.Event.Route). Requests
// Echo answers itself pass through untouched: no route (404, also through
// a group's RouteNotFound catch-alls) or another method (405). Installed
// both globally and on a route, the two run as one layer with the route's
// options (the inner layer takes the request over); Config.Skipper leaves
// routes out of a global install. A body consumed before the middleware
// is refused (500, logged with the fix). An error returned by the
// handlers is sent through Echo's HTTPErrorHandler inside the capture, so it
// is recorded and a replay equals the first answer; the middleware then
// returns nil. While the rest of the chain runs, c.Request() carries the
// engine's context (in atomic mode the transaction:
// sqlstore.Tx(c.Request().Context()), gormstore.DB(c.Request().Context()))
// and c.Response() writes into the engine's capture; both are restored
// afterwards.
//
// New panics with an error wrapping core.ErrConfig when e is nil.
func New(e *core.Engine, opts ...core.RouteOption) echo.MiddlewareFunc {
	return NewWithConfig(Config{Engine: e, Options: opts})
}

// NewWithConfig is New with a Config; it panics on an invalid
// configuration (see Config.ToMiddleware for the error instead).
func NewWithConfig(config Config) echo.MiddlewareFunc {
	mw, err := config.ToMiddleware()
	if err != nil {
		panic(err)
	}
	return mw
}

// ToMiddleware returns the middleware, or an error wrapping core.ErrConfig
// when the configuration is invalid.
func (config Config) ToMiddleware() (echo.MiddlewareFunc, error) {
	if config.Engine == nil {
		return nil, fmt.Errorf("%w: echoidem: Config.Engine is nil", core.ErrConfig)
	}
	skip := config.Skipper
	if skip == nil {
		skip = middleware.DefaultSkipper
	}
	return (&layer{rt: config.Engine.Route(config.Options...), skip: skip}).wrap, nil
}

// layer is one installed middleware. ToMiddleware returns its method value
// wrap, whose code is the same for every layer: preInstalled finds layers
// among Echo's Pre middleware by it.
type layer struct {
	rt     *core.Route
	skip   middleware.Skipper
	routes routeSet
}

func (l *layer) wrap(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		if l.skip(c) {
			return next(c)
		}
		if l.rt.Protects(c.Request()) && !l.routes.matched(c) {
			if c.Path() == "" && l.beforeRouting(c) {
				// Installed with Pre: Echo has not routed yet, and Pre
				// middleware after this one may still rewrite the path or
				// the method onto a route (RemoveTrailingSlash, Rewrite,
				// MethodOverride): fail closed.
				req := c.Request()
				l.rt.Refuse(c.Response(), req, fmt.Errorf("%w: echoidem: %s %s may reach a route, but the middleware runs before Echo routes the request (installed with Pre); install it with Use, on a group or on a route",
					core.ErrNotProtected, req.Method, req.URL.Path))
				return nil
			}
			// The router answers itself (404, 405). A request the route
			// does not protect still goes to Serve, which passes it
			// through (and takes it over from an outer layer, as a nested
			// layer does).
			return next(c)
		}
		var err error
		res := c.Response()
		l.rt.Serve(res, c.Request(), c.Path(), c, func(w http.ResponseWriter, r *http.Request) {
			if w == http.ResponseWriter(res) { // passed through unprotected
				req := c.Request()
				defer c.SetRequest(req)
				c.SetRequest(r)
				err = next(c)
				return
			}
			captured(c, w, r, next)
		})
		return err
	}
}

// captured runs h with c's request r and a response writing into the
// engine's capture w, and restores c's own afterwards. An error h returns
// is sent through Echo's HTTPErrorHandler inside the capture, so it is
// the answer recorded.
func captured(c echo.Context, w http.ResponseWriter, r *http.Request, h echo.HandlerFunc) {
	req, res := c.Request(), c.Response()
	defer func() { c.SetRequest(req); c.SetResponse(res) }()
	c.SetRequest(r)
	inner := echo.NewResponse(w, c.Echo())
	inner.Status = http.StatusOK // as a fresh Echo response
	c.SetResponse(inner)
	if herr := h(c); herr != nil {
		c.Error(herr) // the answer Echo would send, captured
	}
}

// Within serves c's request for a service that owns its transaction, as
// core.Route.Within does (rt an atomic route: a TxStore, not Leased),
// and passes the Echo context on, which core.Route.Within called by hand
// cannot: Caller finds it, and the decisions are labelled with c.Path().
// handler is an Echo handler; it runs with c, whose Request() carries the
// transaction and the attempt (sqlstore.Tx(c.Request().Context()),
// core.MarkEffect) and whose Response() writes into the engine's capture
// (both are restored afterwards); an error it returns goes through Echo's
// HTTPErrorHandler inside the capture, as under the middleware. The client
// gets the answer after inTx returned (the commit); Within returns nil:
//
//	route := eng.Route()
//	e.POST("/payments", func(c echo.Context) error {
//		return echoidem.Within(c, route, svc.InTx, createPayment)
//	})
func Within(c echo.Context, rt *core.Route, inTx core.TxFunc, handler echo.HandlerFunc) error {
	var h http.HandlerFunc
	if handler != nil {
		h = func(w http.ResponseWriter, r *http.Request) { captured(c, w, r, handler) }
	}
	rt.ServeWithin(c.Response(), c.Request(), c.Path(), c, inTx, h)
	return nil
}

// beforeRouting reports whether c, with an empty c.Path(), has not been
// routed yet. In Echo v4 a request that matches no route at all looks the
// same before and after routing (empty path, the 404 handler, no
// parameters), so the context cannot tell; Echo's own Pre middleware list
// can: the request is taken as unrouted when an echoidem layer is
// installed with Pre. Should a later Echo version hide that list, it falls
// back to asking the router whether the request as it stands reaches a
// route (which misses the rewrites of later Pre middleware).
func (l *layer) beforeRouting(c echo.Context) bool {
	if installed, known := preInstalled(c.Echo()); known {
		return installed
	}
	return l.routes.routable(c)
}

// premiddleware is the index of Echo's unexported field holding the Pre
// middleware (no accessor exists), or nil when this Echo version has no
// such []echo.MiddlewareFunc field.
var premiddleware = func() []int {
	f, ok := reflect.TypeOf(echo.Echo{}).FieldByName("premiddleware")
	if !ok || f.Type != reflect.TypeOf([]echo.MiddlewareFunc(nil)) {
		return nil
	}
	return f.Index
}()

// layerCode is the code of (*layer).wrap method values, the same for every
// layer (set in init: wrap itself leads to preInstalled).
var layerCode uintptr

func init() { layerCode = reflect.ValueOf((&layer{}).wrap).Pointer() }

// preInstalled reports whether an echoidem layer is among e's Pre
// middleware; known is false when the Pre middleware cannot be read. It
// only reads the field (as ServeHTTP does), never writes it.
func preInstalled(e *echo.Echo) (installed, known bool) {
	if premiddleware == nil {
		return false, false
	}
	pre := reflect.ValueOf(e).Elem().FieldByIndex(premiddleware)
	for i := range pre.Len() {
		if pre.Index(i).Pointer() == layerCode {
			return true, true
		}
	}
	return false, true
}

// routeSet tells requests that matched a route from those Echo answers
// itself. For a 404 or a 405 Echo still sets c.Path() to the nearest route
// path (or to a RouteNotFound route's, which groups with middleware
// register), so the path alone cannot tell.
type routeSet struct {
	known sync.Map // routeKey → struct{}: a route registered for the method and path
}

type routeKey struct{ method, path string }

// notFound is Echo's global 404 handler, as the router sets it.
var notFound = reflect.ValueOf(echo.NotFoundHandler).Pointer()

// matched reports whether c's request matched a route registered for its
// method: false when no route matched, when the router found the path but
// not the method (405: it set the Allow value), when it chose its 404
// handler, or a handler registered with RouteNotFound.
func (s *routeSet) matched(c echo.Context) bool {
	path := c.Path()
	if path == "" || c.Get(echo.ContextKeyHeaderAllow) != nil {
		return false
	}
	if reflect.ValueOf(c.Handler()).Pointer() == notFound {
		return false
	}
	k := routeKey{c.Request().Method, path}
	if _, ok := s.known.Load(k); ok {
		return true
	}
	// Not seen yet: look the route up (once per route; requests the router
	// answers with a RouteNotFound handler look it up every time, since a
	// route may be added later).
	e := c.Echo()
	found := hasRoute(e.Router(), k)
	for _, r := range e.Routers() { // host routers
		found = found || hasRoute(r, k)
	}
	if found {
		s.known.Store(k, struct{}{})
	}
	return found
}

// routable reports whether Echo's router would route c's request to a
// route registered for its method: for a middleware that runs before
// routing (Pre), where c.Path() is still empty.
func (s *routeSet) routable(c echo.Context) bool {
	e, req := c.Echo(), c.Request()
	router := e.Router()
	if r, ok := e.Routers()[req.Host]; ok {
		router = r
	}
	probe := e.NewContext(req, nil)
	router.Find(req.Method, echo.GetPath(req), probe)
	return s.matched(probe)
}

func hasRoute(r *echo.Router, k routeKey) bool {
	for _, rt := range r.Routes() {
		if rt.Method == k.method && rt.Path == k.path {
			return true
		}
	}
	return false
}

// Caller adapts a function reading the caller from the Echo context
// (typically a value an authentication middleware stored with c.Set) to a
// core.CallerFunc:
//
//	core.WithCaller(echoidem.Caller(func(c echo.Context) (string, error) {
//		account, _ := c.Get("account").(string)
//		return account, nil
//	}))
//
// It needs the Echo context, which the echoidem middleware and Within pass
// to the engine. Anywhere else (core.Route.Within or Route.Serve called by
// hand, net/http's Handler) it fails with an error wrapping
// core.ErrNotProtected that names the fix: the request is refused with a
// 500 not-protected problem (a wiring fault of the server, not the
// client's: never a 401), logged at WARN.
func Caller(f func(echo.Context) (string, error)) core.CallerFunc {
	return func(r *http.Request) (string, error) {
		c, ok := core.NativeFrom(r.Context()).(echo.Context)
		if !ok {
			return "", errNoContext
		}
		return f(c)
	}
}

var errNoContext = fmt.Errorf("%w: echoidem.Caller found no Echo context: the request is served neither by an echoidem middleware nor by echoidem.Within "+
	"(core.Route.Within called by hand from an Echo handler? return echoidem.Within(c, route, inTx, handler) instead)", core.ErrNotProtected)

// DownstreamKey is core.DownstreamKey for an Echo handler: the
// deterministic key of step (such as "charge") of the protected request c
// runs, to pass to an external API. It reads c.Request().Context(), which
// is what core.DownstreamKey needs. Outside a protected request it returns
// an error wrapping core.ErrNoAttempt, never an empty key.
func DownstreamKey(c echo.Context, step string) (string, error) {
	return core.DownstreamKey(c.Request().Context(), step)
}
