package fiberidem_test

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"regexp"

	"github.com/gofiber/fiber/v3"
	"github.com/valyala/fasthttp"
)

// The scenario suite (core/scenario) is written against net/http: its
// routes are http.HandlerFuncs and it sends its requests to an
// http.Handler. These helpers put a Fiber app in between, so that every
// scenario goes through Fiber's own request, response and routing:
//
//   - serve makes the app an http.Handler (as Fiber's adaptor.FiberApp
//     does, but keeping the request's context: the app's first
//     middleware, fromHTTP, sets it as c.Context(), as a Fiber middleware
//     that puts a deadline or a transaction there would);
//   - handler makes a route's http.HandlerFunc a Fiber handler that reads
//     c's request and writes c's response through Fiber's API, as a
//     Fiber handler does: the body in place (c.Body(), valid until the
//     handler returns), the header fields with c.Response().Header, the
//     body with c.Response().AppendBody. A Flush makes the answer a
//     stream (c.Response().SetBodyStream), Fiber's way to stream.

// param matches a ServeMux/chi path parameter ("{id}").
var param = regexp.MustCompile(`\{(\w+)\}`)

// fiberPattern translates "/orders/{id}" to Fiber's "/orders/:id".
func fiberPattern(p string) string { return param.ReplaceAllString(p, ":$1") }

// newApp returns an app with fromHTTP installed first, and no recovery:
// panics must reach the suite.
func newApp() *fiber.App {
	app := fiber.New()
	app.Use(fromHTTP)
	return app
}

type httpContextKey struct{}

// fromHTTP gives c the context of the net/http request serve received.
func fromHTTP(c fiber.Ctx) error {
	if ctx, ok := c.RequestCtx().UserValue(httpContextKey{}).(context.Context); ok {
		c.SetContext(ctx)
	}
	return c.Next()
}

// serve returns app as an http.Handler: each request is copied into a
// fasthttp request (with its context as a user value for fromHTTP), the
// app serves it on this goroutine (so a panic reaches the caller), and its
// response, or its stream, is copied to w.
func serve(app *fiber.App) http.Handler {
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

// handler returns h as a Fiber handler (see the top of this file).
func handler(h http.HandlerFunc) fiber.Handler {
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

// fiberWriter is the http.ResponseWriter of handler: it writes c's
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
