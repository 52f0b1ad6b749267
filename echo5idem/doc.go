// Package echo5idem adds Idempotency-Key support to Echo v5 routers
// (github.com/labstack/echo/v5): one line, globally or per route, over the
// state machine of package core. Package echoidem is the same for Echo v4.
//
//	eng, _ := core.New(store, core.WithCaller(echo5idem.Caller(func(c *echo.Context) (string, error) {
//		account, _ := c.Get("account").(string)
//		return account, nil
//	})))
//	e.Use(echo5idem.New(eng))
//
// A record is (caller, scope, key), the scope empty unless core.Scope
// names one: the same key on another route is a 422. c.Path() labels the
// decisions (observe.Event.Route). A service that opens its own transaction
// calls Within from its handler. Errors returned by handlers are
// answered by Echo's HTTPErrorHandler inside the capture, so a replay
// equals the first answer. In atomic mode handlers reach the transaction
// through c.Request().Context() (sqlstore.Tx, gormstore.DB).
//
// A record is (caller, scope, key), the scope empty unless a core.Scope
// option names one: the route is never part of it, so the same key on
// another route (or another order's path) is a key reused for another
// request, 422, and a request keeps its identity under another router or a
// renamed path parameter. c.Path(), the route pattern
// ("/orders/:id/refunds"), labels the decisions for observability
// (observe.Event.Route). Requests Echo answers itself pass through untouched:
// no route (404, also through a group's RouteNotFound catch-alls) or
// another method (405); the router says so in c.RouteInfo(). Installed with
// e.Pre the middleware runs before routing (c.RouteInfo() still empty) and
// refuses every covered request with a 500 not-protected problem, logged
// with the fix: a later Pre middleware may still rewrite the request onto a
// route.
//
// Installed globally and again on a route, the two run as one protection
// with the route's options (the inner layer takes the request over);
// Config.Skipper leaves routes out of a global install. Config implements
// echo.MiddlewareConfigurator: ToMiddleware returns a configuration error
// instead of panicking. A body consumed before the middleware is refused
// (500, logged with the fix). An error returned by the handlers is sent
// through Echo's HTTPErrorHandler inside the capture, so it is recorded and
// a replay equals the first answer; the middleware then returns nil. While
// the rest of the chain runs, c.Request() carries the engine's context and
// c.Response() is an *echo.Response writing into the engine's capture; both
// are restored afterwards.
package echo5idem
