package ginidem

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
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
	rt := config.Engine.Route(config.Options...)
	return func(c *gin.Context) {
		pattern := c.FullPath()
		if pattern == "" || (config.Skipper != nil && config.Skipper(c)) {
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
			captured(c, w, r, c.Next)
		})
		if !ran {
			c.Abort()
		}
	}, nil
}

// useCachedBody gives the request the body an earlier c.ShouldBindBodyWith
// consumed and Gin kept under gin.BodyBytesKey.
func useCachedBody(c *gin.Context) {
	v, _ := c.Get(gin.BodyBytesKey)
	if b, ok := v.([]byte); ok {
		c.Request.Body = io.NopCloser(bytes.NewReader(b))
		c.Request.ContentLength = int64(len(b))
	}
}

// captured runs fn (the rest of the chain, Within's handler) with the
// engine's request r and, unless w is c.Writer itself (passed through
// unprotected), a writer into the engine's capture w; it restores c's own
// afterwards.
func captured(c *gin.Context, w http.ResponseWriter, r *http.Request, fn func()) {
	req, gw := c.Request, c.Writer
	defer func() { c.Request = req }()
	c.Request = r
	if w == http.ResponseWriter(gw) {
		fn()
		return
	}
	defer func() { c.Writer = gw }()
	cw := &writer{ResponseWriter: w, ctx: r.Context(), status: gw.Status(), size: -1}
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
// caller function for core.WithCaller. Outside the middleware and Within it fails with an error
// wrapping core.ErrNotProtected that names the fix (a 500, never a 401).
func Caller(f func(*gin.Context) (string, error)) func(*http.Request) (string, error) {
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

// writer is the gin.ResponseWriter the handlers write to while the engine
// captures the response. Of the interface's twelve methods Header is the
// capture writer's (embedded) and Pusher nil; the others keep Gin's
// bookkeeping: like Gin's own writer it holds the status until the first
// byte (or WriteHeaderNow), and counts the size. Flush, Hijack and Unwrap
// reach the engine's writer, which decides what a stream or a hijack means
// for the record.
type writer struct {
	http.ResponseWriter                 // the engine's capture writer: Header
	ctx                 context.Context // the request's, for CloseNotify
	status              int
	size                int // -1 until the header is written
}

func (w *writer) WriteHeader(code int) {
	switch {
	case code >= 100 && code < 200: // informational: sent (or ignored) by the engine's writer now
		w.ResponseWriter.WriteHeader(code)
	case code > 0 && !w.Written():
		w.status = code
	}
}

func (w *writer) WriteHeaderNow() {
	if !w.Written() {
		w.size = 0
		w.ResponseWriter.WriteHeader(w.status)
	}
}

func (w *writer) Write(p []byte) (int, error) {
	w.WriteHeaderNow()
	n, err := w.ResponseWriter.Write(p)
	w.size += n
	return n, err
}

func (w *writer) WriteString(s string) (int, error) {
	w.WriteHeaderNow()
	n, err := io.WriteString(w.ResponseWriter, s)
	w.size += n
	return n, err
}

func (w *writer) Status() int   { return w.status }
func (w *writer) Size() int     { return w.size }
func (w *writer) Written() bool { return w.size != -1 }

// Flush sends the pending header and flushes through the engine's writer.
func (w *writer) Flush() {
	w.WriteHeaderNow()
	_ = http.NewResponseController(w.ResponseWriter).Flush()
}

// Hijack hands the connection over when the engine's writer allows it (not
// in atomic mode) and nothing of the body was written yet, as Gin does.
func (w *writer) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	if w.size > 0 {
		return nil, nil, errors.New("ginidem: response body already written")
	}
	conn, rw, err := http.NewResponseController(w.ResponseWriter).Hijack()
	if err == nil && w.size < 0 {
		w.size = 0 // the header must not be written after a hijack
	}
	return conn, rw, err
}

// CloseNotify fires when the request's context is done (the client went
// away, or the request ended).
func (w *writer) CloseNotify() <-chan bool {
	ch := make(chan bool, 1)
	context.AfterFunc(w.ctx, func() { ch <- true })
	return ch
}

// Pusher returns nil: the engine's capture writer has no server push.
func (w *writer) Pusher() http.Pusher { return nil }

// Unwrap returns the engine's writer (for http.ResponseController).
func (w *writer) Unwrap() http.ResponseWriter { return w.ResponseWriter }
