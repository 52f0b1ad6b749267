// Package ginidem adds Idempotency-Key support to Gin routers: one line,
// globally or per route, over the state machine of package core.
//
//	e, _ := core.New(store, core.WithCaller(ginidem.Caller(func(c *gin.Context) (string, error) {
//		return c.GetString("account"), nil
//	})))
//	r.Use(ginidem.New(e))
//
// The scope is the method and c.FullPath(); a replay or rejection aborts
// the chain with c.Abort. In atomic mode handlers reach the transaction
// through c.Request.Context() (sqlstore.TxFrom, gormstore.DB).
//
// Installed globally and again on a route, the two run as one protection
// with the route's options; Config.Skipper leaves routes out of a global
// install (NewWithConfig).
package ginidem
