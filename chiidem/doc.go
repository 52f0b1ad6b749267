// Package chiidem adds Idempotency-Key support to chi routers: one line,
// globally or per route, over the state machine of package core.
//
//	e, _ := core.New(store, core.WithCaller(func(r *http.Request) (string, error) {
//		return accountFrom(r.Context()), nil
//	}))
//	r.Use(chiidem.New(e))
//
// A record is (caller, scope, key), the scope empty unless core.Scope names
// one: a key is unique within its caller, whatever the route, and the same
// key on another route is a 422 (the fingerprint holds the method and the
// concrete path). The route is looked up in the router tree even before
// chi has routed the request, so chi's own 404 and 405 pass untouched and
// decisions are labelled with the route pattern (core.Event.Route). In
// atomic mode handlers reach the transaction through r.Context()
// (sqlstore.Tx, gormstore.DB).
//
// Installed globally and again on a route, the two run as one protection
// with the route's options; Config.Skipper leaves requests out of a global
// install (NewWithConfig). Install path-rewriting middleware
// (middleware.StripSlashes, URLFormat, CleanPath) before chiidem: a request
// that one installed after it would route is refused, never passed
// through unprotected.
package chiidem
