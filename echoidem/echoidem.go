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
	// Options are the route options over the engine's defaults (default: none).
	Options []core.RouteOption
}

// New returns Echo middleware that protects the requests it sees with e and
// the route options opts, installed globally (e.Use), on a group or on one
// route (see the package documentation; installed with e.Pre it refuses
// every covered request). It panics with an error wrapping core.ErrConfig
// when e is nil.
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

// layer is one installed middleware. Its method value wrap has the same
// code for every layer: preInstalled finds layers in Echo's Pre list by it.
type layer struct {
	rt     *core.Route
	skip   middleware.Skipper
	routes sync.Map // routeKey → struct{}: a route registered for the method and path
}

func (l *layer) wrap(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		if l.skip(c) {
			return next(c)
		}
		if l.rt.Protects(c.Request()) && !l.matched(c) {
			if c.Path() == "" && preInstalled(c.Echo()) {
				// Not routed yet, and a later Pre middleware may still
				// rewrite the request onto a route: fail closed.
				req := c.Request()
				l.rt.Refuse(c.Response(), req, fmt.Errorf("%w: echoidem: %s %s may reach a route, but the middleware runs before Echo routes the request (installed with Pre); install it with Use, on a group or on a route",
					core.ErrNotProtected, req.Method, req.URL.Path))
				return nil
			}
			return next(c) // Echo answers itself (404, 405)
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

// captured runs h with c's request r and a response into the engine's
// capture w, then restores c's own; an error h returns is answered by Echo's
// HTTPErrorHandler inside the capture, so it is the answer recorded.
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
// core.Route.Within does (rt atomic), passing the Echo context on (Caller
// finds it; c.Path() labels the decisions); the client gets the answer
// after inTx returned: return echoidem.Within(c, route, svc.InTx, create).
func Within(c echo.Context, rt *core.Route, inTx core.TxFunc, handler echo.HandlerFunc) error {
	var h http.HandlerFunc
	if handler != nil {
		h = func(w http.ResponseWriter, r *http.Request) { captured(c, w, r, handler) }
	}
	rt.ServeWithin(c.Response(), c.Request(), c.Path(), c, inTx, h)
	return nil
}

// premiddleware is the index of Echo's unexported field holding the Pre
// middleware (Echo v4 has no accessor, and an unrouted request looks the
// same as one that matched nothing: docs/decisions.md), or nil when this
// Echo version has no such field (TestPreInstalledReadsEcho then fails).
var premiddleware = func() []int {
	f, ok := reflect.TypeOf(echo.Echo{}).FieldByName("premiddleware")
	if !ok || f.Type != reflect.TypeOf([]echo.MiddlewareFunc(nil)) {
		return nil
	}
	return f.Index
}()

// layerCode is the code of (*layer).wrap method values (set in init: wrap
// itself leads to preInstalled).
var layerCode uintptr

func init() { layerCode = reflect.ValueOf((&layer{}).wrap).Pointer() }

// preInstalled reports whether an echoidem layer is among e's Pre
// middleware, reading the field only (as ServeHTTP does); true, failing
// closed, when it cannot be read.
func preInstalled(e *echo.Echo) bool {
	if premiddleware == nil {
		return true
	}
	pre := reflect.ValueOf(e).Elem().FieldByIndex(premiddleware)
	for i := range pre.Len() {
		if pre.Index(i).Pointer() == layerCode {
			return true
		}
	}
	return false
}

type routeKey struct{ method, path string }

// matched reports whether c's request matched a route registered for its
// method: not when no route matched, when the router found the path but not
// the method (405: the Allow value set), chose its 404 handler, or a
// RouteNotFound route's (which groups with middleware register); c.Path()
// alone cannot tell. Routes found are remembered per layer.
func (l *layer) matched(c echo.Context) bool {
	path := c.Path()
	if path == "" || c.Get(echo.ContextKeyHeaderAllow) != nil || reflect.ValueOf(c.Handler()).Pointer() == notFound {
		return false
	}
	k := routeKey{c.Request().Method, path}
	if _, ok := l.routes.Load(k); ok {
		return true
	}
	e := c.Echo()
	routers := []*echo.Router{e.Router()}
	for _, r := range e.Routers() { // host routers
		routers = append(routers, r)
	}
	for _, r := range routers {
		for _, rt := range r.Routes() {
			if rt.Method == k.method && rt.Path == k.path {
				l.routes.Store(k, struct{}{})
				return true
			}
		}
	}
	return false
}

// notFound is Echo's global 404 handler, as the router sets it.
var notFound = reflect.ValueOf(echo.NotFoundHandler).Pointer()

// Caller adapts a function reading the caller from the Echo context to a
// caller function for core.WithCaller. Outside the middleware and Within it fails with an error
// wrapping core.ErrNotProtected that names the fix (a 500, never a 401).
func Caller(f func(echo.Context) (string, error)) func(*http.Request) (string, error) {
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

// DownstreamKey is core.DownstreamKey(c.Request().Context(), step), an
// error wrapping core.ErrNoAttempt outside a protected request.
func DownstreamKey(c echo.Context, step string) (string, error) {
	return core.DownstreamKey(c.Request().Context(), step)
}
