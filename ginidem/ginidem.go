package ginidem

import (
	"bytes"
	"fmt"
	"io"
	"net/http"

	"github.com/gin-gonic/gin"
	"github.com/idemkit/idem/core"
)

// New returns Gin middleware that protects the requests it sees with e and
// the route options opts (core.Scope, core.Retention, core.Leased, ...).
// Install it globally (r.Use(ginidem.New(e))), on a group, or on one route.
//
// A record is (caller, scope, key), the scope empty unless a core.Scope
// option names one: the route is never part of it, so the same key on
// another route (or another order's path) is a key reused for another
// request, 422, and a request keeps its identity under another router or
// a renamed path parameter. c.FullPath(), the route pattern
// ("/orders/:id/refunds"), labels the decisions for observability
// (core.Event.Route). Requests that matched no route (404, 405) pass
// through untouched. When the engine
// answers without running the handlers (replay, 409, 422, 400, ...), the
// chain is stopped with c.Abort. While the rest of the chain runs,
// c.Request carries the engine's context (in atomic mode the transaction:
// sqlstore.Tx(c.Request.Context()), gormstore.DB(c.Request.Context()))
// and c.Writer captures the response; both are restored afterwards.
//
// Installed both globally and on a route, the two run as one layer with
// the route's options (the inner layer takes the request over). To leave a
// route out of a global install, use NewWithConfig with a Skipper.
//
// A middleware before it that read the body with c.ShouldBindBodyWith
// leaves the bytes Gin cached (gin.BodyBytesKey): they are what is
// fingerprinted. A body consumed otherwise is refused (500, logged with
// the fix), never fingerprinted as empty.
//
// New panics with an error wrapping core.ErrConfig when e is nil.
func New(e *core.Engine, opts ...core.RouteOption) gin.HandlerFunc {
	return NewWithConfig(Config{Engine: e, Options: opts})
}

// Config configures the middleware.
type Config struct {
	// Engine is the idempotency engine. Required.
	Engine *core.Engine
	// Skipper selects requests that pass through unprotected (default:
	// none). It runs after routing, so c.FullPath() is the route pattern:
	//
	//	Skipper: func(c *gin.Context) bool { return c.FullPath() == "/webhooks/:provider" }
	Skipper gin.Skipper
	// Options are the route options (core.Scope, core.Retention,
	// core.Leased, ...) over the engine's defaults (default: none).
	Options []core.RouteOption
}

// NewWithConfig is New with a Config; it panics with an error wrapping
// core.ErrConfig on an invalid configuration (see Config.ToMiddleware for
// the error instead).
func NewWithConfig(config Config) gin.HandlerFunc {
	mw, err := config.ToMiddleware()
	if err != nil {
		panic(err)
	}
	return mw
}

// ToMiddleware returns the middleware, or an error wrapping core.ErrConfig
// when the configuration is invalid.
func (config Config) ToMiddleware() (gin.HandlerFunc, error) {
	if config.Engine == nil {
		return nil, fmt.Errorf("%w: ginidem: Config.Engine is nil", core.ErrConfig)
	}
	skip := config.Skipper
	rt := config.Engine.Route(config.Options...)
	return func(c *gin.Context) {
		pattern := c.FullPath()
		if pattern == "" || (skip != nil && skip(c)) {
			// No route matched (Gin answers 404 or 405 itself), or skipped.
			c.Next()
			return
		}
		if rt.Protects(c.Request) {
			useCachedBody(c)
		}
		ran := false
		rt.Serve(c.Writer, c.Request, pattern, c, func(w http.ResponseWriter, r *http.Request) {
			ran = true
			next(c, w, r)
		})
		if !ran {
			c.Abort()
		}
	}, nil
}

// useCachedBody gives the request the body a middleware before this one
// read with c.ShouldBindBodyWith, which Gin keeps under gin.BodyBytesKey:
// the request's own body is consumed by then.
func useCachedBody(c *gin.Context) {
	v, ok := c.Get(gin.BodyBytesKey)
	if !ok {
		return
	}
	b, ok := v.([]byte)
	if !ok {
		return
	}
	c.Request.Body = io.NopCloser(bytes.NewReader(b))
	c.Request.ContentLength = int64(len(b))
}

// next runs the rest of the chain with the writer and request of the engine.
func next(c *gin.Context, w http.ResponseWriter, r *http.Request) {
	if w == http.ResponseWriter(c.Writer) { // passed through unprotected
		req := c.Request
		defer func() { c.Request = req }()
		c.Request = r
		c.Next()
		return
	}
	captured(c, w, r, c.Next)
}

// captured runs fn with c's request r and a writer into the engine's
// capture w, and restores c's own afterwards.
func captured(c *gin.Context, w http.ResponseWriter, r *http.Request, fn func()) {
	req, gw := c.Request, c.Writer
	defer func() { c.Request, c.Writer = req, gw }()
	c.Request = r
	cw := &writer{w: w, ctx: r.Context(), status: gw.Status(), size: -1}
	c.Writer = cw
	fn()
	// Gin writes a status set without a body (c.Status(204)) after the
	// chain returns; the engine must see it before it records the response.
	cw.WriteHeaderNow()
}

// Within serves c's request for a service that owns its transaction, as
// core.Route.Within does (rt an atomic route: a TxStore, not Leased),
// and passes the Gin context on, which core.Route.Within called by hand
// cannot: Caller finds it, and the decisions are labelled with
// c.FullPath(). handler is a Gin handler; it runs with c, whose Request
// carries the transaction and the attempt (sqlstore.Tx(c.Request.Context()),
// core.MarkEffect) and whose Writer writes into the engine's capture
// (both are restored afterwards). The client gets the answer after inTx
// returned (the commit):
//
//	route := e.Route()
//	r.POST("/payments", func(c *gin.Context) {
//		ginidem.Within(c, route, svc.InTx, createPayment)
//	})
func Within(c *gin.Context, rt *core.Route, inTx core.TxFunc, handler gin.HandlerFunc) {
	var h http.HandlerFunc
	if handler != nil {
		h = func(w http.ResponseWriter, r *http.Request) { captured(c, w, r, func() { handler(c) }) }
	}
	rt.ServeWithin(c.Writer, c.Request, c.FullPath(), c, inTx, h)
}

// Caller adapts a function reading the caller from the Gin context (typically
// a value an authentication middleware stored with c.Set) to a
// core.CallerFunc:
//
//	core.WithCaller(ginidem.Caller(func(c *gin.Context) (string, error) {
//		return c.GetString("account"), nil
//	}))
//
// It needs the Gin context, which the ginidem middleware and Within pass
// to the engine. Anywhere else (core.Route.Within or Route.Serve called by
// hand, net/http's Handler) it fails with an error wrapping
// core.ErrNotProtected that names the fix: the request is refused with a
// 500 not-protected problem (a wiring fault of the server, not the
// client's: never a 401), logged at WARN.
func Caller(f func(*gin.Context) (string, error)) core.CallerFunc {
	return func(r *http.Request) (string, error) {
		c, ok := core.NativeFrom(r.Context()).(*gin.Context)
		if !ok {
			return "", errNoContext
		}
		return f(c)
	}
}

var errNoContext = fmt.Errorf("%w: ginidem.Caller found no Gin context: the request is served neither by a ginidem middleware nor by ginidem.Within "+
	"(core.Route.Within called by hand from a Gin handler? call ginidem.Within(c, route, inTx, handler) instead)", core.ErrNotProtected)

// DownstreamKey is core.DownstreamKey for a Gin handler: the deterministic
// key of step (such as "charge") of the protected request c runs, to pass
// to an external API. It reads c.Request.Context(), which is what
// core.DownstreamKey needs (a *gin.Context is a context.Context, but not
// the request's: core.DownstreamKey(c, step) fails). Outside a protected
// request it returns an error wrapping core.ErrNoAttempt, never an empty
// key.
func DownstreamKey(c *gin.Context, step string) (string, error) {
	return core.DownstreamKey(c.Request.Context(), step)
}
