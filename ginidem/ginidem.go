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
// The scope defaults to the method and c.FullPath(), the route pattern
// ("POST /orders/:id/refunds"), so every order shares one scope. Requests
// that matched no route (404, 405) pass through untouched. When the engine
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
	req, gw := c.Request, c.Writer
	defer func() { c.Request, c.Writer = req, gw }()
	c.Request = r
	if w == http.ResponseWriter(gw) { // passed through unprotected
		c.Next()
		return
	}
	cw := &writer{w: w, ctx: r.Context(), status: gw.Status(), size: -1}
	c.Writer = cw
	c.Next()
	// Gin writes a status set without a body (c.Status(204)) after the
	// chain returns; the engine must see it before it records the response.
	cw.WriteHeaderNow()
}

// Caller adapts a function reading the caller from the Gin context (typically
// a value an authentication middleware stored with c.Set) to a
// core.CallerFunc:
//
//	core.WithCaller(ginidem.Caller(func(c *gin.Context) (string, error) {
//		return c.GetString("account"), nil
//	}))
//
// Outside a request served by a ginidem middleware it answers
// core.ErrNoCaller.
func Caller(f func(*gin.Context) (string, error)) core.CallerFunc {
	return func(r *http.Request) (string, error) {
		c, ok := core.NativeFrom(r.Context()).(*gin.Context)
		if !ok {
			return "", fmt.Errorf("%w: ginidem.Caller used outside a ginidem middleware", core.ErrNoCaller)
		}
		return f(c)
	}
}

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
