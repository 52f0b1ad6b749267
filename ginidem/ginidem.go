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
// the route options opts, installed globally, on a group or on one route
// (see the package documentation). It panics with an error wrapping
// core.ErrConfig when e is nil.
func New(e *core.Engine, opts ...core.RouteOption) gin.HandlerFunc {
	return NewWithConfig(Config{Engine: e, Options: opts})
}

// Config configures the middleware.
type Config struct {
	// Engine is the idempotency engine. Required.
	Engine *core.Engine
	// Skipper selects requests that pass through unprotected (default:
	// none). It runs after routing: c.FullPath() is the route pattern.
	Skipper gin.Skipper
	// Options are the route options over the engine's defaults (default: none).
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

// useCachedBody gives the request the body an earlier c.ShouldBindBodyWith
// consumed and Gin kept under gin.BodyBytesKey.
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
// core.Route.Within does (rt atomic), passing the Gin context on (Caller
// finds it; c.FullPath() labels the decisions); the client gets the answer
// after inTx returned: ginidem.Within(c, route, svc.InTx, create).
func Within(c *gin.Context, rt *core.Route, inTx core.TxFunc, handler gin.HandlerFunc) {
	var h http.HandlerFunc
	if handler != nil {
		h = func(w http.ResponseWriter, r *http.Request) { captured(c, w, r, func() { handler(c) }) }
	}
	rt.ServeWithin(c.Writer, c.Request, c.FullPath(), c, inTx, h)
}

// Caller adapts a function reading the caller from the Gin context to a
// core.CallerFunc. Outside the middleware and Within it fails with an error
// wrapping core.ErrNotProtected that names the fix (a 500, never a 401).
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

// DownstreamKey is core.DownstreamKey(c.Request.Context(), step), an
// error wrapping core.ErrNoAttempt outside a protected request.
func DownstreamKey(c *gin.Context, step string) (string, error) {
	return core.DownstreamKey(c.Request.Context(), step)
}
