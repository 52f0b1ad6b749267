package fiberidem

import (
	"io"
	"net/http"
	"net/url"

	"github.com/gofiber/fiber/v3"
	"github.com/idemkit/idem/core"
	"github.com/valyala/fasthttp"
)

// exchange is one request through one layer: the net/http view of c's
// request that the engine reads, and the writer the engine answers into,
// which writes c's response.
type exchange struct {
	c     fiber.Ctx
	res   response            // writes c's response
	outer http.ResponseWriter // the engine's writer: &res, or the capture of the layer this one is nested in
	cp    capture             // this layer's, while its chain runs
	url   url.URL
	body  body
}

// captureKey is the c.Locals (user value) key of the capture of the
// layer whose chain is running.
type captureKey struct{}

// capture is the engine's capture writer of a layer while its chain runs.
// A layer nested in it (a route's install under a global one) takes it as
// its own writer, so the engine sees the nesting and hands the request
// over; the outer layer then leaves c's response alone.
type capture struct {
	w     http.ResponseWriter
	taken bool
}

func newExchange(c fiber.Ctx) *exchange {
	x := &exchange{c: c, res: response{c: c}}
	x.outer = &x.res
	if cp, ok := c.RequestCtx().UserValue(captureKey{}).(*capture); ok && !cp.taken {
		cp.taken = true
		x.outer = cp.w
	}
	return x
}

func (x *exchange) writer() http.ResponseWriter { return x.outer }

// request returns the net/http view of c's request: method, URL (path as
// sent, decoded as net/http decodes it; raw query), host, header fields
// and body, with c.Context() as its context. Everything but the body is
// copied, since the engine keeps some of it (the key, the caller read from
// a header) past the handler; the body is read in place, while c's request
// is valid, and the engine copies what it keeps. Header names are
// canonicalised as net/http does, so Header.Get finds them whatever the
// client sent and whether or not the app disables Fiber's normalizing.
func (x *exchange) request() *http.Request {
	c := x.c
	fr := c.Request()
	uri := fr.URI()
	rawPath, query, host := uri.PathOriginal(), uri.QueryString(), fr.Host()
	header := make(http.Header, 8)
	for k, v := range fr.Header.All() {
		if !skipRequestField(k) {
			header.Add(string(k), string(v)) // canonical, as net/http's
		}
	}

	x.url.RawQuery = string(query)
	raw := string(rawPath)
	x.url.Path = raw
	if p, err := url.PathUnescape(raw); err == nil {
		// As net/http's URL parsing (url.URL.setPath) sets it: RawPath
		// whenever the path as sent is not the default encoding of the
		// decoded one, also when nothing was unescaped ("/a!b", raw UTF-8).
		x.url.Path = p
		if x.url.EscapedPath() != raw {
			x.url.RawPath = raw
		}
	}

	var base http.Request
	base.Method = c.Method()
	base.URL = &x.url
	base.Proto, base.ProtoMajor, base.ProtoMinor = "HTTP/1.1", 1, 1
	base.Header = header
	base.Host = string(host)
	if b := fr.Body(); len(b) > 0 {
		x.body.b = b
		base.Body = &x.body
		base.ContentLength = int64(len(b))
	} else {
		base.Body = http.NoBody
	}
	return base.WithContext(c.Context())
}

// skipRequestField reports the fields net/http does not keep in
// Request.Header (Host is Request.Host).
func skipRequestField(k []byte) bool { return string(k) == fiber.HeaderHost }

// run runs the rest of the chain (next) for the engine with its writer w
// and request r: c.Context() is r's context meanwhile. Unless the request
// passes through unprotected (w is this layer's own writer), the answer
// the chain leaves in c's response, or the answer of the app's
// ErrorHandler to the error it returns, is moved into w, the engine's
// capture, which decides what c's response becomes.
func (x *exchange) run(w http.ResponseWriter, r *http.Request, next func() error) error {
	c := x.c
	prev := c.Context()
	c.SetContext(r.Context())
	defer c.SetContext(prev)
	if w == x.outer { // passed through unprotected: the chain writes c's response itself
		return next()
	}
	cp := &x.cp
	cp.w = w
	// c.Locals, without its variadic argument's allocation.
	up := c.RequestCtx().UserValue(captureKey{})
	c.RequestCtx().SetUserValue(captureKey{}, cp)
	defer c.RequestCtx().SetUserValue(captureKey{}, up)
	err := next()
	if cp.taken {
		// A nested layer protected the request and wrote its answer
		// through w (transparent once taken over) into c's response.
		return err
	}
	if err != nil {
		if c.App().ErrorHandler(c, err) != nil {
			_ = c.SendStatus(fiber.StatusInternalServerError) // as Fiber does when the ErrorHandler fails
		}
	}
	info, _ := core.AttemptFrom(r.Context())
	x.moveResponse(w, info.Atomic)
	return nil
}

// moveResponse moves the answer in res (status, header fields, body) into
// w, the engine's capture, and leaves res empty for what the engine writes
// back (the answer after the commit, a problem, a replay). A streamed body
// (c.SendStream, c.SendStreamWriter) stays a stream in leased mode: w is
// flushed, which sends the status and header fields on and makes the
// record keep no body, and fasthttp sends the stream after the handler;
// in atomic mode, where nothing reaches the client before the commit, it
// is read into w to its end.
func (x *exchange) moveResponse(w http.ResponseWriter, atomic bool) {
	res := x.c.Response()
	x.moveHeader(w.Header(), &res.Header)
	status := res.StatusCode()
	if res.IsBodyStream() {
		w.WriteHeader(status)
		if !atomic {
			_ = http.NewResponseController(w).Flush()
			return
		}
		_, _ = io.Copy(w, res.BodyStream())
		_ = res.CloseBodyStream()
		return
	}
	body := res.Body() // a raw body (c.Send) or fasthttp's buffer
	owned := res.SwapBody(nil)
	w.WriteHeader(status)
	if len(body) > 0 {
		_, _ = w.Write(body)
	}
	if len(res.Body()) == 0 {
		res.SwapBody(owned[:0]) // the buffer back to res, for the answer to come
	}
}

// moveHeader moves the header fields of res (but Content-Length, which
// fasthttp computes) into h, copied (the engine may record them), and
// deletes them from res.
func (x *exchange) moveHeader(h http.Header, res *fasthttp.ResponseHeader) {
	for k, v := range res.All() {
		if key := string(k); key != fiber.HeaderContentLength {
			// The name as fasthttp spells it (normalized unless the app
			// disables it).
			h[key] = append(h[key], string(v))
		}
	}
	for k := range h {
		res.Del(k)
	}
}

// response is the http.ResponseWriter over c's response that the engine
// answers into: the header fields go to c's response with the status, the
// body is appended to it. It has neither Flush nor Hijack: fasthttp sends
// the response after the handler returns.
type response struct {
	c     fiber.Ctx
	h     http.Header
	wrote bool
}

func (w *response) Header() http.Header {
	if w.h == nil {
		w.h = make(http.Header)
	}
	return w.h
}

func (w *response) WriteHeader(code int) {
	if w.wrote || code < 200 { // fasthttp sends no informational responses
		return
	}
	w.wrote = true
	res := w.c.Response()
	for k, vs := range w.h {
		res.Header.Del(k)
		for _, v := range vs {
			res.Header.Add(k, v)
		}
	}
	res.SetStatusCode(code)
}

func (w *response) Write(p []byte) (int, error) {
	if !w.wrote {
		w.WriteHeader(http.StatusOK)
	}
	w.c.Response().AppendBody(p)
	return len(p), nil
}

func (w *response) WriteString(s string) (int, error) {
	if !w.wrote {
		w.WriteHeader(http.StatusOK)
	}
	w.c.Response().AppendBodyString(s)
	return len(s), nil
}

// body is the request body the engine reads: c's request body, in place.
type body struct {
	b   []byte
	off int
}

func (b *body) Read(p []byte) (int, error) {
	if b.off >= len(b.b) {
		return 0, io.EOF
	}
	n := copy(p, b.b[b.off:])
	b.off += n
	return n, nil
}

func (b *body) Close() error { return nil }
