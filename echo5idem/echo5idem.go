package echo5idem

import (
	"fmt"
	"net/http"

	"github.com/idemkit/idem/core"
	"github.com/labstack/echo/v5"
	"github.com/labstack/echo/v5/middleware"
)

// Config configures the middleware. It implements
// echo.MiddlewareConfigurator, as Echo's own middleware configs do.
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

var _ echo.MiddlewareConfigurator = Config{}

// New returns Echo middleware that protects the requests it sees with e and
// the route options opts. Install it globally (e.Use(echo5idem.New(eng))),
// on a group, or on one route.
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
// handlers is sent through Echo's HTTPErrorHandler inside the capture, so
// it is recorded and a replay equals the first answer; the middleware then
// returns nil. While the rest of the chain runs, c.Request() carries the
// engine's context (in atomic mode the transaction:
// sqlstore.Tx(c.Request().Context()), gormstore.DB(c.Request().Context()))
// and c.Response() is an *echo.Response writing into the engine's
// capture; both are restored afterwards.
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
		return nil, fmt.Errorf("%w: echo5idem: Config.Engine is nil", core.ErrConfig)
	}
	skip := config.Skipper
	if skip == nil {
		skip = middleware.DefaultSkipper
	}
	rt := config.Engine.Route(config.Options...)
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c *echo.Context) error {
			if skip(c) {
				return next(c)
			}
			if rt.Protects(c.Request()) && !matched(c) {
				if !routed(c) {
					// Installed with Pre: Echo has not routed yet, and
					// Pre middleware after this one may still rewrite the
					// path or the method onto a route (RemoveTrailingSlash,
					// Rewrite, MethodOverride): fail closed.
					req := c.Request()
					rt.Refuse(c.Response(), req, fmt.Errorf("%w: echo5idem: %s %s may reach a route, but the middleware runs before Echo routes the request (installed with Pre?); install it with Use, on a group or on a route",
						core.ErrNotProtected, req.Method, req.URL.Path))
					return nil
				}
				// The router answers itself (404, 405). A request the
				// route does not protect still goes to Serve, which passes
				// it through (and takes it over from an outer layer, as a
				// nested layer does).
				return next(c)
			}
			var err error
			res := c.Response()
			rt.Serve(res, c.Request(), c.Path(), c, func(w http.ResponseWriter, r *http.Request) {
				if w == res { // passed through unprotected
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
	}, nil
}

// captured runs h with c's request r and a response writing into the
// engine's capture w, and restores c's own afterwards. An error h returns
// is sent through Echo's HTTPErrorHandler inside the capture, so it is
// the answer recorded.
func captured(c *echo.Context, w http.ResponseWriter, r *http.Request, h echo.HandlerFunc) {
	req, res := c.Request(), c.Response()
	defer func() { c.SetRequest(req); c.SetResponse(res) }()
	c.SetRequest(r)
	inner := echo.NewResponse(w, c.Logger())
	inner.Status = http.StatusOK // as Echo's own response before a write
	c.SetResponse(inner)
	if herr := h(c); herr != nil {
		c.Echo().HTTPErrorHandler(c, herr) // the answer Echo would send, captured
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
//	e.POST("/payments", func(c *echo.Context) error {
//		return echo5idem.Within(c, route, svc.InTx, createPayment)
//	})
func Within(c *echo.Context, rt *core.Route, inTx core.TxFunc, handler echo.HandlerFunc) error {
	var h http.HandlerFunc
	if handler != nil {
		h = func(w http.ResponseWriter, r *http.Request) { captured(c, w, r, handler) }
	}
	rt.ServeWithin(c.Response(), c.Request(), c.Path(), c, inTx, h)
	return nil
}

// matched reports whether Echo's router matched c's request to a route
// registered for its method (or for any method: echo.RouteAny). The
// router marks what it answers itself: no route (404) and another method
// (405) get a RouteInfo without a method, and a RouteNotFound route (which
// groups with middleware register as catch-alls) has the method
// echo.RouteNotFound. Before routing (Pre) the RouteInfo is empty too.
func matched(c *echo.Context) bool {
	m := c.RouteInfo().Method
	return m != "" && m != echo.RouteNotFound
}

// routed reports whether the router has run for c: before it (Pre
// middleware) c has neither a route nor a path; after it, even a request
// the router answers itself has a RouteInfo named for its answer
// (echo.NotFoundRouteName, echo.MethodNotAllowedRouteName).
func routed(c *echo.Context) bool {
	return c.Path() != "" || c.RouteInfo().Name != ""
}

// Caller adapts a function reading the caller from the Echo context
// (typically a value an authentication middleware stored with c.Set) to a
// core.CallerFunc:
//
//	core.WithCaller(echo5idem.Caller(func(c *echo.Context) (string, error) {
//		account, _ := c.Get("account").(string)
//		return account, nil
//	}))
//
// It needs the Echo context, which the echo5idem middleware and Within
// pass to the engine. Anywhere else (core.Route.Within or Route.Serve
// called by hand, net/http's Handler) it fails with an error wrapping
// core.ErrNotProtected that names the fix: the request is refused with a
// 500 not-protected problem (a wiring fault of the server, not the
// client's: never a 401), logged at WARN.
func Caller(f func(*echo.Context) (string, error)) core.CallerFunc {
	return func(r *http.Request) (string, error) {
		c, ok := core.NativeFrom(r.Context()).(*echo.Context)
		if !ok {
			return "", errNoContext
		}
		return f(c)
	}
}

var errNoContext = fmt.Errorf("%w: echo5idem.Caller found no Echo context: the request is served neither by an echo5idem middleware nor by echo5idem.Within "+
	"(core.Route.Within called by hand from an Echo handler? return echo5idem.Within(c, route, inTx, handler) instead)", core.ErrNotProtected)

// DownstreamKey is core.DownstreamKey for an Echo handler: the
// deterministic key of step (such as "charge") of the protected request c
// runs, to pass to an external API. It reads c.Request().Context(), which
// is what core.DownstreamKey needs. Outside a protected request it returns
// an error wrapping core.ErrNoAttempt, never an empty key.
func DownstreamKey(c *echo.Context, step string) (string, error) {
	return core.DownstreamKey(c.Request().Context(), step)
}
