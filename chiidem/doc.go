// Package chiidem adds Idempotency-Key support to chi routers: one line,
// globally or per route, over the state machine of package core.
//
//	e, _ := core.New(store, core.WithCaller(func(r *http.Request) (string, error) {
//		return accountFrom(r.Context()), nil
//	}))
//	r.Use(chiidem.New(e))
//
// Install it globally (r.Use), in a group or sub-router, or on one route
// (r.With(chiidem.New(e)).Post(...)). Installed both globally and on a
// route, the two run as one layer with the route's options (the inner layer
// takes the request over); Config.Skipper leaves requests out of a global
// install (NewWithConfig).
//
// A record is (caller, scope, key), the scope empty unless a core.Scope
// option names one: the route is never part of it, so the same key on
// another route (or another order's path) is a key reused for another
// request, 422 (the fingerprint holds the method and the concrete path),
// and a request keeps its identity when the service moves to another
// router or renames a path parameter.
//
// Requests that match no route (404, 405) pass through untouched. A
// middleware installed with Use runs before its router routes the request,
// so it asks that router's tree (chi.Routes.Find) whether the request
// reaches a route, with the path that router will route: after the
// rewriting of the middleware before it (middleware.StripSlashes,
// URLFormat, CleanPath), in a sub-router after the mounts. Install those
// rewriting middlewares before chiidem: a request that one of them
// installed after chiidem would move onto a route is refused with a 500
// problem (fail closed, logged with the fix), never passed through.
//
// The route pattern found ("/orders/{id}/refunds", the same whether the
// middleware is installed globally, in a sub-router or per route; a non-chi
// handler mounted with Mount: "/legacy/*"; outside a chi router,
// Request.Pattern's) labels the decisions for observability
// (observe.Event.Route); it is never the concrete path and never part of the
// identity. Handlers reach the engine's context (in atomic mode the
// transaction: sqlstore.Tx(r.Context()), gormstore.DB(r.Context())) from
// their request; callers are named with core.WithCaller reading
// r.Context().
package chiidem
