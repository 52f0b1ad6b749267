// Package echoidem adds Idempotency-Key support to Echo (v4) routers: one
// line, globally or per route, over the state machine of package core.
//
//	eng, _ := core.New(store, core.WithCaller(echoidem.Caller(func(c echo.Context) (string, error) {
//		account, _ := c.Get("account").(string)
//		return account, nil
//	})))
//	e.Use(echoidem.New(eng))
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
// install (NewWithConfig). Echo's own 404 and 405 pass through untouched.
package echoidem
