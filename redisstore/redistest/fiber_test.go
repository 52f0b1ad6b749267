package redistest

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"testing"

	"github.com/gofiber/fiber/v3"
	"github.com/valyala/fasthttp"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/scenario"
	"github.com/idemkit/idem/fiberidem"
)

// Fiber's entry of the adapters table: its factories and exceptions as
// fiberidem's own tests write them (fiberidem/scenario_test.go), with the
// minimum of its net/http bridge (fiberidem/bridge_test.go) copied here.

// bodyBuffered is why Fiber cannot run BodyConsumedUpstream.
const bodyBuffered = "fasthttp reads the whole body before any handler runs: a Fiber middleware cannot consume it (c.Body() is a buffer), and a net/http one in front of the bridge hands Fiber an empty body"

// notFiberGlobal is notFiber for the global run.
var notFiberGlobal = scenario.Except(bodyBuffered, "BodyConsumedUpstream")

// notFiber are the scenarios of net/http features Fiber does not have,
// each with the reason (fiberidem/scenario_test.go; fiberidem/README.md
// says what a Fiber service gets instead).
var notFiber = []scenario.Option{
	scenario.Except(bodyBuffered, "BodyConsumedUpstream"),
	scenario.Except("Fiber has no synchronous Hijack: fasthttp hands the connection over only after the handler returned (c.RequestCtx().Hijack)",
		"LeasedHijack"),
	scenario.Except("Fiber holds an answer whole in memory (fasthttp's response buffer): the engine spills what it records past the cap, but delivers into that buffer",
		"AtomicSpillPastCap"),
	scenario.Except("an application's own body limit in front of Fiber is Fiber's BodyLimit, which fasthttp enforces with its own 413 before any handler runs",
		"UpstreamBodyLimit"),
}

var fiberAdapter = adapter{
	name:         "fiber",
	except:       notFiber,
	exceptGlobal: []scenario.Option{notFiberGlobal},
	route: func(t *testing.T, e *core.Engine, routes []scenario.Route) http.Handler {
		app := newFiberApp()
		for _, rt := range routes {
			app.Add([]string{rt.Method}, colon(rt.Pattern), fiberidem.New(e, rt.Options...), fiberHandler(rt.Handler))
		}
		return serveFiber(app)
	},
	global: func(t *testing.T, e *core.Engine, routes []scenario.Route) http.Handler {
		app := newFiberApp()
		app.Use(fiberidem.New(e))
		for _, rt := range routes {
			app.Add([]string{rt.Method}, colon(rt.Pattern), fiberHandler(rt.Handler))
		}
		return serveFiber(app)
	},
	nested: func(t *testing.T, e *core.Engine, routes []scenario.Route) http.Handler {
		app := newFiberApp()
		app.Use(fiberidem.New(e))
		for _, rt := range routes {
			app.Add([]string{rt.Method}, colon(rt.Pattern), fiberidem.New(e, rt.Options...), fiberHandler(rt.Handler))
		}
		return serveFiber(app)
	},
}

// newFiberApp returns an app with fromHTTP installed first, and no
// recovery: panics must reach the suite.
func newFiberApp() *fiber.App {
	app := fiber.New()
	app.Use(fromHTTP)
	return app
}

type httpContextKey struct{}

// fromHTTP gives c the context of the net/http request serveFiber received.
func fromHTTP(c fiber.Ctx) error {
	if ctx, ok := c.RequestCtx().UserValue(httpContextKey{}).(context.Context); ok {
		c.SetContext(ctx)
	}
	return c.Next()
}

// serveFiber returns app as an http.Handler: each request is copied into a
// fasthttp request (with its context as a user value for fromHTTP), the
// app serves it on this goroutine (so a panic reaches the caller), and its
// response, or its stream, is copied to w.
func serveFiber(app *fiber.App) http.Handler {
	h := app.Handler()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req fasthttp.Request
		req.Header.SetMethod(r.Method)
		req.SetRequestURI(r.RequestURI)
		req.SetHost(r.Host)
		for k, vs := range r.Header {
			for _, v := range vs {
				req.Header.Add(k, v)
			}
		}
		if r.Body != nil {
			b, err := io.ReadAll(r.Body)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			req.SetBody(b)
		}
		var fctx fasthttp.RequestCtx
		fctx.Init(&req, &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 1}, nil)
		fctx.SetUserValue(httpContextKey{}, r.Context())
		h(&fctx)

		res := &fctx.Response
		for k, v := range res.Header.All() {
			if string(k) != fiber.HeaderContentLength {
				w.Header().Add(string(k), string(v))
			}
		}
		w.WriteHeader(res.StatusCode())
		if !res.IsBodyStream() {
			_, _ = w.Write(res.Body())
			return
		}
		buf := make([]byte, 32<<10)
		for {
			n, err := res.BodyStream().Read(buf)
			if n > 0 {
				_, _ = w.Write(buf[:n])
				_ = http.NewResponseController(w).Flush()
			}
			if err != nil {
				break
			}
		}
		_ = res.CloseBodyStream()
	})
}

// fiberHandler returns h as a Fiber handler that reads c's request and
// writes c's response through Fiber's API, as a Fiber handler does; a
// Flush makes the answer a stream (c.Response().SetBodyStream).
func fiberHandler(h http.HandlerFunc) fiber.Handler {
	return func(c fiber.Ctx) error {
		r, err := http.NewRequestWithContext(c.Context(), c.Method(), string(c.Request().RequestURI()), bytes.NewReader(c.Body()))
		if err != nil {
			return err
		}
		for k, v := range c.Request().Header.All() {
			r.Header.Add(string(k), string(v))
		}
		r.Host = string(c.Request().Host())
		r.ContentLength = int64(len(c.Body()))
		w := &fiberWriter{c: c, h: http.Header{}}
		h(w, r)
		w.WriteHeader(http.StatusOK) // a handler that wrote nothing: 200
		return nil
	}
}

// fiberWriter is the http.ResponseWriter of fiberHandler: it writes c's
// response.
type fiberWriter struct {
	c      fiber.Ctx
	h      http.Header
	wrote  bool
	stream *bytes.Buffer // after a Flush: the rest of the body
}

func (w *fiberWriter) Header() http.Header { return w.h }

func (w *fiberWriter) WriteHeader(code int) {
	if w.wrote || code < 200 {
		return
	}
	w.wrote = true
	res := w.c.Response()
	for k, vs := range w.h {
		for _, v := range vs {
			res.Header.Add(k, v)
		}
	}
	res.SetStatusCode(code)
}

func (w *fiberWriter) Write(p []byte) (int, error) {
	w.WriteHeader(http.StatusOK)
	if w.stream != nil {
		return w.stream.Write(p)
	}
	w.c.Response().AppendBody(p)
	return len(p), nil
}

// Flush makes the answer a stream: what was written so far and what the
// handler writes next are sent by fasthttp as a stream after the handler
// returns.
func (w *fiberWriter) Flush() {
	w.WriteHeader(http.StatusOK)
	if w.stream != nil {
		return
	}
	res := w.c.Response()
	w.stream = bytes.NewBuffer(append([]byte(nil), res.Body()...))
	res.SetBodyStream(w.stream, -1)
}

var _ http.Flusher = (*fiberWriter)(nil)

// Hijack is not Fiber's: fasthttp hands the connection over only after
// the handler returned (c.RequestCtx().Hijack).
func (w *fiberWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	return nil, nil, http.ErrNotSupported
}
