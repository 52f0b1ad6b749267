// Package fiberidem adds Idempotency-Key support to Fiber v3 apps: one
// line, for the app, a group or a route, over the state machine of
// package core.
//
//	e, _ := core.New(store, core.WithCaller(fiberidem.Caller(func(c fiber.Ctx) (string, error) {
//		account, _ := c.Locals("account").(string)
//		return account, nil
//	})))
//	app.Use(fiberidem.New(e))
//
// A record is (caller, scope, key), the scope empty unless core.Scope
// names one: the same key on another route is a 422. The route's pattern
// labels the decisions (observe.Event.Route). A replay or a rejection is
// written into c's response and the chain does not run. Handlers reach the
// attempt, and in atomic mode the transaction, through c.Context()
// (sqlstore.Tx, gormstore.DB, core.MarkEffect, DownstreamKey). A service
// that opens its own transaction calls Within from its handler.
//
// The route is never part of the record, so the same key on another route
// (or another order's path) is a key reused for another request, 422.
// Installed with Use (for the app or a group) the middleware runs before
// Fiber routes the request: it looks the route up in the app's stack as
// Fiber's router will (trailing slashes, case, parameters), and a request
// that reaches no route (Fiber's 404 or 405) passes through untouched,
// unless middleware registered after it (with Use) runs for its path
// first: that middleware may rewrite the path onto a route (Fiber's
// rewrite middleware, c.Path), so a request of a protected method is
// refused instead (500 not-protected, logged with the fix: install the
// middleware after the rewriting one, or on the routes). Installed for the app and again on a route, the two run as one
// protection with the route's options (the inner layer takes the request
// over); Config.Next leaves requests out (NewWithConfig).
//
// The handlers write their answer with c as usual (c.Status, c.JSON,
// c.SendString, or an error, which goes through the app's ErrorHandler
// inside the capture, so it is recorded and a replay equals the first
// answer; the middleware then returns nil). While the rest of the chain
// runs, c.Context() carries the engine's context; it is restored afterwards.
//
// Fiber reuses a request's buffers once the handler returns, so the engine
// reads the request through a net/http view of it that holds its own copy
// of what outlives the handler: the method, the path and query, the host
// and the header fields; the body is read in place and copied once by the
// engine, as under every adapter. A streamed answer (c.SendStream,
// c.SendStreamWriter) is sent as a stream and not kept in leased mode (a
// duplicate gets its status with a response-not-kept problem, as after a
// Flush under net/http); in atomic mode it is read to its end before the
// commit.
package fiberidem
