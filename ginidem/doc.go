// Package ginidem adds Idempotency-Key support to Gin routers: one line,
// globally or per route, over the state machine of package core.
//
//	e, _ := core.New(store, core.WithCaller(ginidem.Caller(func(c *gin.Context) (string, error) {
//		return c.GetString("account"), nil
//	})))
//	r.Use(ginidem.New(e))
//
// A record is (caller, scope, key), the scope empty unless core.Scope
// names one: the same key on another route is a 422. c.FullPath() labels
// the decisions (core.Event.Route). A replay or rejection aborts the chain
// with c.Abort. In atomic mode handlers reach the transaction through
// c.Request.Context() (sqlstore.Tx, gormstore.DB). A service that opens
// its own transaction calls Within from its handler.
//
// Installed globally and again on a route, the two run as one protection
// with the route's options; Config.Skipper leaves routes out of a global
// install (NewWithConfig).
package ginidem
