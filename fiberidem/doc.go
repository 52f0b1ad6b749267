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
// labels the decisions (core.Event.Route). A replay or a rejection is
// written into c's response and the chain does not run. Handlers reach the
// attempt, and in atomic mode the transaction, through c.Context()
// (sqlstore.Tx, gormstore.DB, core.MarkEffect, DownstreamKey). A service
// that opens its own transaction calls Within from its handler.
//
// Installed for the app and again on a route, the two run as one
// protection with the route's options; Config.Next leaves requests out
// (NewWithConfig).
package fiberidem
