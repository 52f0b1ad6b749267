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
// decisions (core.Event.Route). A service that opens its own transaction
// calls Within from its handler. Errors returned by handlers are
// answered by Echo's HTTPErrorHandler inside the capture, so a replay
// equals the first answer. In atomic mode handlers reach the transaction
// through c.Request().Context() (sqlstore.Tx, gormstore.DB).
//
// Installed globally and again on a route, the two run as one protection
// with the route's options; Config.Skipper leaves routes out of a global
// install. Config implements echo.MiddlewareConfigurator: ToMiddleware
// returns a configuration error instead of panicking. Echo's own 404 and
// 405 pass through untouched.
package echo5idem
