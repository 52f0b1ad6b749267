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
// the decisions (observe.Event.Route). A replay or rejection aborts the chain
// with c.Abort. In atomic mode handlers reach the transaction through
// c.Request.Context() (sqlstore.Tx, gormstore.DB). A service that opens
// its own transaction calls Within from its handler.
//
// The route is never part of the record, so a request keeps its identity
// under another router or a renamed path parameter. Requests that matched
// no route (404, 405: c.FullPath() is empty) pass through untouched. While
// the rest of the chain runs, c.Request carries the engine's context and
// c.Writer captures the response; both are restored afterwards.
//
// Installed globally and again on a route, the two run as one protection
// with the route's options (the inner layer takes the request over);
// Config.Skipper leaves routes out of a global install (NewWithConfig). A
// middleware before it that read the body with c.ShouldBindBodyWith leaves
// the bytes Gin cached (gin.BodyBytesKey): they are what is fingerprinted.
// A body consumed otherwise is refused (500, logged with the fix), never
// fingerprinted as empty.
package ginidem
