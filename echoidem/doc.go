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
// (observe.Event.Route).
//
// Requests Echo answers itself pass through untouched: no route (404, also
// through a group's RouteNotFound catch-alls) or another method (405). Echo
// sets c.Path() to the nearest route even then, so a request counts as
// routed only when a route is registered for its method and c.Path().
// Installed with e.Pre the middleware runs before routing and refuses every
// request of a covered method (500 not-protected, logged with the fix): a
// later Pre middleware (RemoveTrailingSlash, Rewrite, MethodOverride) may
// still move a request onto a route. Echo v4 cannot tell a request before
// routing from one that matched nothing, so echoidem reads Echo's Pre list
// for its own layers (docs/decisions.md).
//
// Installed globally and again on a route, the two run as one protection
// with the route's options (the inner layer takes the request over);
// Config.Skipper leaves routes out of a global install (NewWithConfig). A
// body consumed before the middleware is refused (500, logged with the
// fix). While the rest of the chain runs, c.Request() carries the engine's
// context and c.Response() writes into the engine's capture; both are
// restored afterwards.
package echoidem
