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
	// Skipper selects requests that pass through unprotected (default: none).
	Skipper middleware.Skipper
	// Options are the route options over the engine's defaults (default: none).
	Options []core.RouteOption
}

var _ echo.MiddlewareConfigurator = Config{}

// New returns Echo middleware that protects the requests it sees with e and
// the route options opts (see the package documentation). It panics with
// an error wrapping core.ErrConfig when e is nil.
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
					// Not routed yet (Pre), and a later Pre middleware may
					// still rewrite the request onto a route: fail closed.
					req := c.Request()
					rt.Refuse(c.Response(), req, fmt.Errorf("%w: echo5idem: %s %s may reach a route, but the middleware runs before Echo routes the request (installed with Pre?); install it with Use, on a group or on a route",
						core.ErrNotProtected, req.Method, req.URL.Path))
					return nil
				}
				return next(c) // Echo answers itself (404, 405)
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

// captured runs h with c's request r and a response into the engine's
// capture w, then restores c's own; an error h returns is answered by Echo's
// HTTPErrorHandler inside the capture, so it is the answer recorded.
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
// core.Route.Within does (rt atomic), passing the Echo context on (Caller
// finds it; c.Path() labels the decisions); the client gets the answer
// after inTx returned: return echo5idem.Within(c, route, svc.InTx, create).
func Within(c *echo.Context, rt *core.Route, inTx core.TxFunc, handler echo.HandlerFunc) error {
	var h http.HandlerFunc
	if handler != nil {
		h = func(w http.ResponseWriter, r *http.Request) { captured(c, w, r, handler) }
	}
	rt.ServeWithin(c.Response(), c.Request(), c.Path(), c, inTx, h)
	return nil
}

// matched reports whether the router matched c's request to a route for
// its method: a 404 or 405 gets a RouteInfo without a method, a
// RouteNotFound route (a group's catch-all) the method echo.RouteNotFound,
// and before routing (Pre) the RouteInfo is empty.
func matched(c *echo.Context) bool {
	m := c.RouteInfo().Method
	return m != "" && m != echo.RouteNotFound
}

// routed reports whether the router has run for c: after it even a 404 or
// 405 has a RouteInfo named for it (echo.NotFoundRouteName, ...).
func routed(c *echo.Context) bool {
	return c.Path() != "" || c.RouteInfo().Name != ""
}

// Caller adapts a function reading the caller from the Echo context to a
// caller function for core.WithCaller. Outside the middleware and Within it fails with an error
// wrapping core.ErrNotProtected that names the fix (a 500, never a 401).
func Caller(f func(*echo.Context) (string, error)) func(*http.Request) (string, error) {
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

// DownstreamKey is core.DownstreamKey(c.Request().Context(), step), an
// error wrapping core.ErrNoAttempt outside a protected request.
func DownstreamKey(c *echo.Context, step string) (string, error) {
	return core.DownstreamKey(c.Request().Context(), step)
}
