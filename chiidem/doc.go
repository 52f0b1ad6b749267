// Package chiidem adds Idempotency-Key support to chi routers: one line,
// globally or per route, over the state machine of package core.
//
//	e, _ := core.New(store, core.WithCaller(func(r *http.Request) (string, error) {
//		return accountFrom(r.Context()), nil
//	}))
//	r.Use(chiidem.New(e))
//
// The scope is the method and chi's route pattern, found in the router tree
// even before chi has routed the request. In atomic mode handlers reach the
// transaction through r.Context() (sqlstore.TxFrom, gormstore.DB).
//
// Installed globally and again on a route, the two run as one protection
// with the route's options; Config.Skipper leaves requests out of a global
// install (NewWithConfig). Install path-rewriting middleware
// (middleware.StripSlashes, URLFormat, CleanPath) before chiidem: a request
// that one installed after it would route is refused, never passed
// through unprotected.
package chiidem
