package core

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"reflect"
	"strings"
	"sync/atomic"
	"time"

	"github.com/idemkit/idem/core/observe"
	"github.com/idemkit/idem/core/store"
)

// Handler protects next with the engine's defaults and opts. A record is
// (caller, scope, key), the scope empty unless opts name one (Scope): the
// route never is part of it, and the fingerprint (method, concrete path,
// query, body) tells a key reused on another route apart (422). The
// net/http ServeMux pattern that matched (Request.Pattern) labels the
// decisions for observability (Event.Route).
//
// next may also be a whole *http.ServeMux (protecting every route): the
// mux is asked (ServeMux.Handler) before it routes whether it would
// answer the request itself (404, 405, redirects), and those requests
// pass through untouched.
func (e *Engine) Handler(next http.Handler, opts ...RouteOption) http.Handler {
	rt := e.Route(opts...)
	if mux, ok := next.(*http.ServeMux); ok {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if !rt.Protects(r) {
				rt.Serve(w, r, "", nil, mux.ServeHTTP) // passes through
				return
			}
			h, pattern := mux.Handler(r)
			if pattern == "" || reflect.TypeOf(h) == redirectHandlerType {
				mux.ServeHTTP(w, r) // the mux answers itself
				return
			}
			rt.Serve(w, r, trimMuxPattern(pattern), nil, mux.ServeHTTP)
		})
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rt.Serve(w, r, "", nil, next.ServeHTTP)
	})
}

// redirectHandlerType is the type of http.RedirectHandler's handler, which
// ServeMux.Handler returns for a path it redirects (with a pattern).
var redirectHandlerType = reflect.TypeOf(http.RedirectHandler("/", http.StatusTemporaryRedirect))

// trimMuxPattern drops the method of a ServeMux pattern ("POST /orders"
// → "/orders"); a host stays.
func trimMuxPattern(pattern string) string {
	if i := strings.IndexByte(pattern, ' '); i >= 0 && !strings.HasPrefix(pattern, "/") {
		return strings.TrimSpace(pattern[i+1:])
	}
	return pattern
}

// Middleware is Handler as a middleware, for routers built on
// func(http.Handler) http.Handler.
func (e *Engine) Middleware(opts ...RouteOption) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler { return e.Handler(next, opts...) }
}

// call is the per-request state, of every driver: what the machine
// needs of the request (its identity, fingerprint, event, start), the
// attempt once claimed, and for HTTP the capture. The contexts of the
// request that carry it (Value(attemptKey{})) are how MarkEffect,
// Release, DownstreamKey, AttemptFrom and NativeFrom find it, and how a
// nested layer finds the layer it runs in. Its methods handle, panicked
// and reply are HTTP's transport (Exec's, Once's and the finisher's embed
// it).
type call struct {
	base    context.Context // the request's context (a nested layer's: with the outer transaction hidden)
	ctx     context.Context // base carrying the call
	native  any
	claimed bool
	// phase of a claimed call: running until either a nested layer takes
	// the request over (superseded: this layer's attempt is given up and it
	// records nothing) or this layer settles its attempt. The two race only
	// when the nested layer runs on another goroutine (http.TimeoutHandler).
	phase atomic.Int32
	att   attempt
	body  bodyReader
	rec   recorder
	resp  Response
	fp    [sha256.Size]byte // the request's fingerprint
	fps   scratch           // the fingerprint's working memory
	// detached is the claim's context without its cancellation (leased
	// mode: Route.leasedCtx).
	detached detached

	// What prepare found, for the machine.
	route       *Route
	w           http.ResponseWriter
	r, rc       *http.Request // the request as it came; rc: the caller function's and the fingerprinter's (setContext)
	start       time.Time
	ev          observe.Event // the event to emit, filled in as the request goes
	ident       store.Identity
	fingerprint []byte
	// request is what the route records of the request (RecordRequest),
	// nil when nothing; markRequest its sealed form for the mark (a named
	// route on a Settler), markTries the mark's tries (a finisher's).
	request     *RecordedRequest
	markRequest []byte
	markTries   int
}

// NativeFrom returns the framework context (*gin.Context, echo.Context)
// that the adapter passed to Route.Serve for the request whose context is
// ctx, or nil. Framework-typed caller functions use it.
func NativeFrom(ctx context.Context) any {
	if c, ok := ctx.Value(attemptKey{}).(*call); ok {
		return c.native
	}
	return nil
}

// Serve runs one HTTP request through the state machine. Adapters call it:
// pattern is the router's route pattern without the method ("/orders/:id",
// "" when unknown: then Request.Pattern's, if any), a label for
// observability only (Event.Route; never part of the identity, never the
// concrete path), native the framework's context (or nil: NativeFrom
// returns it to caller functions), and next runs the rest of the chain with the
// writer and request it is given (the request carries the engine's context:
// transaction, MarkEffect, Release, DownstreamKey). When the request is not
// protected (method not covered, KeyOptional without a key, fail-open),
// next receives w itself, so adapters can tell pass-through from
// capture by comparing writers.
//
// Nested layers (the middleware installed globally and again on the route)
// run as one: a layer whose request already carries another layer's
// claimed attempt, and whose writer is (or unwraps to) that layer's
// capture, takes the request over (see call.supersede) and protects it
// alone, with its own options; the outer layer then records nothing. A
// protected request that only carries the context of another one (an
// in-process sub-request) is protected on its own, unless it has the
// same identity and fingerprint: then it is the same request nested behind
// a writer without Unwrap, and is taken over too.
func (rt *Route) Serve(w http.ResponseWriter, r *http.Request, pattern string, native any, next func(http.ResponseWriter, *http.Request)) {
	c := rt.prepare(w, r, pattern, native, next)
	if c == nil {
		return
	}
	defer c.rec.free()
	rt.step(&job{c: c, ctx: c.ctx, failOpen: true, allow: rt.e.cfg.recorded}, transport{panicked: c.panicked,
		handle: func(ctx context.Context) (*Response, bool, error) { return c.handle(ctx, next) },
		reply: func(res result) int {
			if !res.open {
				return c.reply(res)
			}
			r := c.r.WithContext(c.ctx)
			r.Body = &c.body
			next(w, r) // fail-open: unprotected, logged at error level
			return 0
		},
	})
}

// prepare reads what identifies r and what its content is: the key, the
// scope, the caller, the body and its fingerprint. It returns nil when it
// has dealt with r already (passed it through to next, or rejected it),
// else the call the machine takes on. A request nested in another
// layer's is taken over from that layer here, once (call.supersede): at
// once when w is that layer's capture, or after the identity, when it is
// the same request behind a writer without Unwrap.
func (rt *Route) prepare(w http.ResponseWriter, r *http.Request, pattern string, native any, next func(http.ResponseWriter, *http.Request)) *call {
	around := claimedCall(r.Context()) // a protected request this one runs inside of
	if around != nil && around.writesTo(w) {
		// Nested in around's layer: taken over before this layer answers
		// or passes anything through.
		if r = rt.takeOver(w, r, around, r.Context()); r == nil {
			return nil
		}
		around = nil
	}
	if !rt.covers(r.Method) {
		next(w, r)
		return nil
	}
	e := rt.e
	key, err := keyFrom(r.Header, e.keyHeader())
	if err == nil && key == "" {
		if rt.p.optionalKey {
			next(w, r)
			return nil
		}
		err = ErrMissingKey
	}
	start := e.cfg.clock()
	if err != nil {
		rt.reject(w, r, observe.Event{Decision: observe.DecisionInvalid, Scope: rt.p.scope, Route: routeLabel(r, pattern), Err: err}, start)
		return nil
	}
	c := &call{route: rt, native: native, r: r, w: w, start: start}
	c.ev = observe.Event{Scope: rt.p.scope, Route: routeLabel(r, pattern), Key: key}
	c.setContext(r.Context())
	if c.ev.Decision, c.ev.Err = c.identify(); c.ev.Err != nil {
		rt.reject(w, c.rc, c.ev, start)
		return nil
	}
	if around != nil && around.att.id == c.ev.ID && (bytes.Equal(around.fingerprint, c.fingerprint) || rt.p.fingerprint != nil || around.att.rt.p.fingerprint != nil) {
		// The same request nested behind a writer without Unwrap: the same
		// identity and fingerprint (with a Fingerprint option on either
		// layer the two cannot be compared: taken over, and refused by
		// nestable, as behind a writer that unwraps). An in-process
		// sub-request to another route that forwards the client's key has
		// the identity (the scope is empty by default) but not the
		// fingerprint: it is protected on its own, and meets the outer's
		// record as a key reused for another request (422).
		taken := rt.takeOver(w, r, around, c.base)
		if taken == nil {
			return nil
		}
		c.setContext(taken.Context()) // the takeover hid the outer's transaction
	}
	if rt.atomic && e.tx.InTx(c.base) && (around == nil || (!around.att.rt.atomic && around.att.lctx == nil)) {
		// The request carries a transaction the engine did not begin (a
		// transaction-per-request middleware's, sqlstore.WithTx): joined,
		// the answer would reach the client before that transaction
		// commits, and a failed commit would leave a 2xx without its
		// effects (docs/contract.md, section 5). An in-process sub-request
		// of an atomic attempt joins that attempt's transaction, whose
		// answer waits for its commit.
		rt.Refuse(w, r, fmt.Errorf("%w: %s %s: the request's context carries the application's transaction (a transaction-per-request middleware, or WithTx), "+
			"which commits after the middleware has answered; make the route Leased() (the record commits on its own connection), "+
			"let the engine begin the transaction for this route, or answer after your own commit with Route.Within (HTTP) or Route.Exec",
			ErrNotProtected, r.Method, r.URL.Path))
		return nil
	}
	return c
}

// setContext makes base the call's context, and the call's own context
// (c.ctx) base carrying c. Until the record is claimed, the caller
// function and the fingerprinter see the request as it came, or, when the
// adapter passed its framework's context, a copy whose context is the
// call (NativeFrom finds it there). The handler's request is made once
// the record is claimed, so a replay or a rejection makes neither it nor
// the leased mode's cancellable context.
func (c *call) setContext(base context.Context) {
	c.base = base
	c.ctx = context.WithValue(base, attemptKey{}, c)
	c.rc = c.r
	if c.native != nil {
		c.rc = c.r.WithContext(c.ctx)
	}
}

// identify names the caller, reads the body and computes the
// fingerprint, the identity and what the route records of the request.
// It returns the decision and the error of a request it refuses.
func (c *call) identify() (observe.Decision, error) {
	rt, r, ev := c.route, c.r, &c.ev
	e := rt.e
	if e.cfg.caller != nil {
		var err error
		if ev.Caller, err = callerOf(e.cfg.caller(c.rc)); err != nil {
			return observe.DecisionInvalid, err
		}
	}
	body, err := c.body.load(r, e.cfg.maxRequest)
	if errors.Is(err, ErrBodyConsumed) {
		e.cfg.logger.ErrorContext(c.rc.Context(), "idempotency: the request body was read before the idempotency middleware, so it cannot be fingerprinted; "+
			"install the middleware before any middleware that reads the body (or make that middleware restore it)",
			slog.String("scope", ev.Scope), slog.String("error", err.Error()))
	}
	if err != nil {
		return observe.DecisionInvalid, err
	}
	if c.rc != r {
		c.rc.Body = &c.body
	}
	if f := rt.p.fingerprint; f == nil {
		c.fingerprint = fingerprint(&c.fps, c.fp[:0], c.rc, ev.Scope, body, nil) // DefaultFingerprint
	} else {
		fp, err := f(c.rc, ev.Scope, body)
		if err != nil {
			return observe.DecisionInvalid, &fingerprintError{err: err}
		}
		c.fingerprint = normalFingerprint(fp)
	}
	c.ident = store.Identity{Caller: ev.Caller, Scope: ev.Scope, Key: ev.Key}
	ev.ID = c.ident.ID()
	if rt.p.record == nil {
		return "", nil
	}
	if c.request, err = rt.recordRequest(r, ev.Caller, body); err != nil {
		return observe.DecisionInvalid, clientErrorf(ErrInvalidRequest, "the fields to record could not be read from the body: %v", err)
	}
	if rt.p.name != "" && e.settler != nil {
		if c.markRequest, err = e.sealRequest(ev.ID, c.request); err != nil {
			return observe.DecisionStoreError, storeErr(err)
		}
	}
	return "", nil
}

// takeOver takes the request r over from the layer of around, which
// protects it already (call.supersede), and returns r with ctx, the
// outer's transaction hidden, for this layer to go on with; nil when
// this route's options cannot take it over (nestable): r is refused.
// When around has settled already (a nested layer on another goroutine),
// r goes on unchanged, protected on its own.
func (rt *Route) takeOver(w http.ResponseWriter, r *http.Request, around *call, ctx context.Context) *http.Request {
	ctx, ok := around.supersede(ctx)
	if !ok {
		return r
	}
	r = r.WithContext(ctx)
	if err := rt.nestable(around.att.rt, r.Method); err != nil {
		rt.Refuse(w, r, err)
		return nil
	}
	return r
}

// handle runs handler (Serve's next, Within's handler) with the capture
// c.rec, and returns what the capture holds.
func (c *call) handle(hctx context.Context, handler func(http.ResponseWriter, *http.Request)) (*Response, bool, error) {
	r := c.r.WithContext(hctx)
	r.Body = &c.body
	c.rec.init(c.w, c.route.atomic, c.route.e.cfg.maxResponse)
	handler(&c.rec, r)
	spill := c.rec.settle()
	c.rec.response(&c.resp)
	return &c.resp, c.rec.through, spill
}

// panicked is the answer recorded for a handler that panicked: the
// engine's 500, which does not show the panic's value.
func (c *call) panicked(v any) *Response {
	p := c.route.e.problemFor(fmt.Errorf("idem: the handler panicked: %v", v))
	p.RecordID = c.ev.ID.String()
	return problemResponse(p)
}

// reply writes res to the client: the handler's answer (the capture's),
// or a replay or a problem document in its place.
func (c *call) reply(res result) int {
	rt := c.route
	switch {
	case res.reject != nil:
		c.rec.resetHeader() // the engine's answer replaces the handler's
		return rt.writeProblem(c.w, c.rc, res.reject, c.ev.ID)
	case res.replay:
		c.rec.resetHeader()
		return rt.writeReplay(c.w, c.rc, &res.ans.resp)
	}
	c.rec.deliver()
	return c.resp.Status
}

// settles reports whether c's layer settles its attempt, and from now on
// no nested layer can take the request over (call.supersede).
func (c *call) settles() bool { return c.phase.CompareAndSwap(phaseRunning, phaseSettled) }

// callerError is a caller function's own failure (not "no caller"): the
// client gets 401, and since its text may name internal systems ("ldap
// bind failed ..."), it goes to the log only, at WARN.
type callerError struct{ err error }

func (e *callerError) Error() string {
	return ErrNoCaller.Error() + ": the caller function failed: " + e.err.Error()
}
func (e *callerError) Unwrap() []error { return []error{ErrNoCaller, e.err} }

// callerOf is a caller function's answer as the engine takes it: "" is
// ErrNoCaller, and the function's own failure a *callerError.
func callerOf(caller string, err error) (string, error) {
	switch {
	case err == nil && caller == "":
		return "", ErrNoCaller
	case err != nil && !errors.Is(err, ErrNoCaller):
		return "", &callerError{err: err}
	}
	return caller, err
}

// fingerprintError is a fingerprint function's own failure: the client
// gets 400 invalid-request without its text, and since the function is
// the application's code (a failure is more likely its bug than the
// client's), it goes to the log at WARN, as a caller function's does.
type fingerprintError struct{ err error }

func (e *fingerprintError) Error() string {
	return ErrInvalidRequest.Error() + ": fingerprint: " + e.err.Error()
}
func (e *fingerprintError) Unwrap() []error { return []error{ErrInvalidRequest, e.err} }

// Refuse answers r with the engine's problem document for err, which
// wraps ErrNotProtected and says how to fix the wiring, and logs err at
// error level (the client's detail does not carry it). Adapters call it
// when they cannot establish how to protect a covered request: failing
// closed instead of passing it through.
func (rt *Route) Refuse(w http.ResponseWriter, r *http.Request, err error) {
	rt.reject(w, r, observe.Event{Decision: observe.DecisionInvalid, Scope: rt.p.scope, Route: routeLabel(r, ""), Err: rt.refused(r.Context(), err)}, rt.e.cfg.clock())
}

// refused returns err wrapping ErrNotProtected, logged at error level:
// the wiring must change, and the client's detail does not say how.
func (rt *Route) refused(ctx context.Context, err error) error {
	if !errors.Is(err, ErrNotProtected) {
		err = fmt.Errorf("%w: %w", ErrNotProtected, err)
	}
	rt.e.cfg.logger.ErrorContext(ctx, "idempotency: request refused", slog.String("error", err.Error()))
	return err
}

// Phases of a claimed call.
const (
	phaseRunning    int32 = iota // the handler chain runs
	phaseSuperseded              // a nested layer took the request over
	phaseSettled                 // this layer settles its attempt
)

// claimedCall returns the protected call in ctx whose attempt is claimed
// and still running, or nil.
func claimedCall(ctx context.Context) *call {
	// c.r: a call of Serve; Once's calls are never nested in.
	if c, ok := ctx.Value(attemptKey{}).(*call); ok && c.r != nil && c.claimed && c.phase.Load() == phaseRunning {
		return c
	}
	return nil
}

// supersede hands the request over from the layer of c (the outer one) to
// a layer nested in it, and returns ctx for the nested layer to go on
// with. The outer attempt is given up (its claim rolled back or released:
// its record never persists), its recorder writes through (what the
// inner layer sends, held until its own commit, passes out as is,
// streaming included), and the outer's transaction is hidden from the
// returned context, so the inner layer claims on its own: in a
// transaction it begins (atomic mode), or committed on its own (leased).
// When control returns to the outer layer it records nothing. It reports
// false, and changes nothing, when the outer layer has settled its
// attempt already (the nested layer ran on after it, on another
// goroutine): the nested layer then protects the request on its own.
func (c *call) supersede(ctx context.Context) (context.Context, bool) {
	if !c.phase.CompareAndSwap(phaseRunning, phaseSuperseded) {
		return ctx, false
	}
	c.att.abort()
	c.rec.passThrough()
	if tx := c.att.e.tx; tx != nil {
		ctx = tx.WithoutTx(ctx)
	}
	return ctx, true
}

// nestable reports, as an error wrapping ErrNotProtected that names the
// fix, why this route's options cannot take a request over from the outer
// layer (route outer) that protected it: the outer layer has decided
// before the takeover what these options would decide differently (a
// missing key, an in-flight duplicate, a fingerprint compared with the
// record, an indeterminate record resolved), so running the pair would
// apply half of the route's options.
// Those pairs are refused loudly at every request instead.
func (rt *Route) nestable(outer *Route, method string) error {
	var why string
	switch {
	case !rt.covers(method):
		why = "the route's own installation does not cover " + method + ", the outer one does"
	case rt.p.optionalKey != outer.p.optionalKey:
		why = "KeyOptional differs between the two installations"
	case rt.p.wait != outer.p.wait:
		why = "WaitInFlight differs between the two installations"
	case rt.p.fingerprint != nil || outer.p.fingerprint != nil:
		why = "a Fingerprint option is set on one of them"
	case rt.p.resolver != outer.p.resolver:
		why = "the route's own WithResolver is not the outer installation's (they are compared as option values: build the option once, r := core.WithResolver(fn), and pass r to both)"
	default:
		return nil
	}
	return fmt.Errorf("%w: the middleware is installed twice on this route (globally or on a group, and on the route) with options the outer installation would contradict (%s); "+
		"leave the route out of the outer installation (Skipper) and protect it on its own, or give both the same options", ErrNotProtected, why)
}

// writesTo reports whether w is c's capture, or wraps it (Unwrap, as
// http.ResponseController follows): the layer serving with w runs in c's
// response chain, nested in c's layer, not in a request of its own that
// merely carries c's context.
func (c *call) writesTo(w http.ResponseWriter) bool {
	for w != nil {
		if w == http.ResponseWriter(&c.rec) {
			return true
		}
		u, ok := w.(interface{ Unwrap() http.ResponseWriter })
		if !ok {
			return false
		}
		w = u.Unwrap()
	}
	return false
}

// routeLabel is the label of r's route for observability (Event.Route):
// the adapter's pattern, else the ServeMux pattern that matched r without
// its method, else "". Never the concrete path, and never part of the
// identity.
func routeLabel(r *http.Request, pattern string) string {
	if pattern != "" {
		return pattern
	}
	return trimMuxPattern(r.Pattern) // maybe with a host
}

// reject answers r, which did not reach the machine, with the problem
// document for ev.Err, and emits ev.
func (rt *Route) reject(w http.ResponseWriter, r *http.Request, ev observe.Event, start time.Time) {
	ev.Status = rt.writeProblem(w, r, ev.Err, ev.ID)
	rt.e.emit(r.Context(), ev, start)
}

// writeProblem writes the problem document for err (of record id, if
// known) and returns its status.
func (rt *Route) writeProblem(w http.ResponseWriter, r *http.Request, err error, id store.ID) int {
	p := rt.e.problemFor(err)
	if id != (store.ID{}) {
		p.RecordID = id.String()
	}
	rt.e.cfg.errorWriter(w, r, p)
	return p.Status
}

// writeReplay writes a recorded response and returns the status sent.
func (rt *Route) writeReplay(w http.ResponseWriter, r *http.Request, resp *recorded) int {
	h := w.Header()
	resp.writeHeader(h, HeaderReplayed)
	if !resp.kept {
		p := rt.e.problemFor(ErrNotKept)
		p.Status = resp.status
		delete(h, "Content-Encoding")
		rt.e.cfg.errorWriter(w, r, p)
		return p.Status
	}
	w.WriteHeader(resp.status)
	_, _ = w.Write(resp.body)
	return resp.status
}

// problemResponse renders p as a recordable response.
func problemResponse(p *Problem) *Response {
	rw := &bufferWriter{h: http.Header{}}
	WriteProblem(rw, nil, p)
	return &Response{Status: p.Status, Header: recordedHeader(rw.h, []string{"Content-Type", "Cache-Control", "Link"}), Body: rw.b, BodyKept: true}
}

type bufferWriter struct {
	h      http.Header
	b      []byte
	status int
}

func (w *bufferWriter) Header() http.Header         { return w.h }
func (w *bufferWriter) WriteHeader(code int)        { w.status = code }
func (w *bufferWriter) Write(p []byte) (int, error) { w.b = append(w.b, p...); return len(p), nil }

// --- request body ----------------------------------------------------------

// bodyReader replays the request body read for the fingerprint. Its buffer
// is allocated per request and never reused: the handler gets the
// bodyReader as Request.Body and may read it after Serve returned (a
// handler behind http.TimeoutHandler reads on its own goroutine after the
// timeout answered), so a pooled buffer could be handed to the next
// request under its reads and show it another request's bytes.
type bodyReader struct {
	buf []byte
	off int
	one [1]byte // the byte past the declared length or the limit, read aside
}

// firstBodyBuffer is the most load allocates before the body's bytes
// arrive: a declared Content-Length is a claim, not bytes received.
const firstBodyBuffer = 4 << 10

// load reads the whole body, up to max bytes. Its buffer grows with the
// bytes that arrive, never from the declared Content-Length alone: it
// starts at the declared length or firstBodyBuffer, whichever is smaller
// (512 bytes when the length is unknown), and doubles when full, up to the
// declared length while the body keeps to it, and up to max. So a client
// that declares 1 MiB and sends 5 bytes holds 4 KiB; a body holds at most
// about twice what it sent, and is copied about once on its way. When the
// buffer is full at the declared length or at max, the next byte is read
// aside: a body of exactly that length ends without growing, and a byte
// more means a body over max (413) or longer than declared (read on: a
// middleware may have replaced the body without its length).
func (b *bodyReader) load(r *http.Request, max int64) ([]byte, error) {
	if r.Body == nil || r.Body == http.NoBody {
		if r.ContentLength > 0 {
			return nil, fmt.Errorf("%w: Content-Length is %d but the body is gone", ErrBodyConsumed, r.ContentLength)
		}
		return nil, nil
	}
	if r.ContentLength > max {
		return nil, clientErrorf(ErrBodyTooLarge, "%d bytes, the limit is %d", r.ContentLength, max)
	}
	size := int64(512) // unknown length: grown as it comes
	if r.ContentLength >= 0 {
		size = min(r.ContentLength, firstBodyBuffer)
	}
	buf := make([]byte, 0, size)
	defer func() { b.buf = buf }()
	for {
		p, aside := buf[len(buf):cap(buf)], false
		if len(p) == 0 {
			if n := int64(len(buf)); n < max && (r.ContentLength < 0 || n != r.ContentLength) {
				buf = growBody(buf, r.ContentLength, max)
				p = buf[len(buf):cap(buf)]
			} else {
				p, aside = b.one[:], true
			}
		}
		n, err := r.Body.Read(p)
		switch {
		case aside && n > 0 && int64(len(buf)) >= max:
			return nil, clientErrorf(ErrBodyTooLarge, "more than %d bytes, the limit is %d", max, max)
		case aside && n > 0: // longer than declared
			buf = append(growBody(buf, r.ContentLength, max), b.one[0])
		default:
			buf = buf[:len(buf)+n]
		}
		if int64(len(buf)) > max {
			return nil, clientErrorf(ErrBodyTooLarge, "more than %d bytes, the limit is %d", max, max)
		}
		if err == io.EOF {
			if r.ContentLength > 0 && len(buf) == 0 {
				// A server's body reader fails with io.ErrUnexpectedEOF on
				// a short body; a clean EOF before the first byte means it
				// was read before us. (A body replaced by a middleware
				// with a different length is not refused.)
				return nil, fmt.Errorf("%w: Content-Length is %d but nothing was left to read", ErrBodyConsumed, r.ContentLength)
			}
			return buf, nil
		}
		if err != nil {
			var mbe *http.MaxBytesError // an application's own, tighter limit (http.MaxBytesReader)
			if errors.As(err, &mbe) {
				return nil, clientErrorf(ErrBodyTooLarge, "more than %d bytes, the limit is %d", mbe.Limit, mbe.Limit)
			}
			return nil, fmt.Errorf("%w: %w", ErrInvalidRequest, err)
		}
	}
}

// growBody returns buf (full) in a buffer of twice its capacity (512
// bytes at least), but no larger than the declared length while buf is
// shorter than it, nor than limit; always with room for a byte more.
func growBody(buf []byte, declared, limit int64) []byte {
	upTo := limit
	if declared >= 0 && int64(len(buf)) < declared {
		upTo = declared
	}
	n := min(max(2*int64(cap(buf)), 512), upTo)
	n = max(n, int64(len(buf))+1)
	grown := make([]byte, len(buf), n)
	copy(grown, buf)
	return grown
}

func (b *bodyReader) Read(p []byte) (int, error) {
	if b.off >= len(b.buf) {
		return 0, io.EOF
	}
	n := copy(p, b.buf[b.off:])
	b.off += n
	return n, nil
}

func (b *bodyReader) Close() error { return nil }

// --- response capture ------------------------------------------------------

// recorder captures a handler's response. It holds the response until the
// outcome is recorded, unless the body passes the cap (both modes) or, in
// leased mode, the handler flushes or hijacks: then it writes through and
// the record says the body was not kept. In atomic mode nothing reaches the
// client before the commit: Flush is deferred and Hijack refused, and past
// the cap the rest of the answer spills to a temporary file (the held bytes
// stay in buf), so the handler keeps its transaction to the end; deliver
// sends the held bytes, then the file, after the commit. If the commit
// fails the client gets the engine's 503 and none of it. So a response
// holds at most the cap (and a copy buffer) in memory. It keeps
// http.Flusher, http.Hijacker and Unwrap working and ignores 1xx.
type recorder struct {
	w        http.ResponseWriter
	atomic   bool
	status   int
	max      int64
	buf      []byte
	kept     bool          // the body is complete in buf
	through  bool          // writing through to w
	spill    *os.File      // atomic mode past the cap: the rest of the answer
	spillW   *bufio.Writer // buffers writes to spill
	failed   error         // spilling failed: every write fails (settle reports it)
	hijacked bool
	// outer is a copy of the response header as it was before the handler
	// ran (what an outer middleware set: CORS), nil when it was empty;
	// resetHeader restores it.
	outer http.Header
}

func (rec *recorder) init(w http.ResponseWriter, atomic bool, max int64) {
	*rec = recorder{w: w, atomic: atomic, max: max, kept: true}
	if h := w.Header(); len(h) > 0 {
		rec.outer = h.Clone()
	}
}

func (rec *recorder) free() {
	if rec.spill != nil {
		_ = rec.spill.Close()
		_ = os.Remove(rec.spill.Name())
		rec.spill, rec.spillW = nil, nil
	}
	rec.buf = nil
}

func (rec *recorder) Header() http.Header { return rec.w.Header() }

// resetHeader drops what the handler put in the response header and
// restores what was there before it ran (an outer middleware's, such as
// CORS headers a browser needs to read the answer at all), for an answer
// of the engine's own that replaces the handler's.
func (rec *recorder) resetHeader() {
	if rec.w == nil {
		return // the handler did not run
	}
	h := rec.w.Header()
	clear(h)
	for k, v := range rec.outer {
		h[k] = v
	}
}

func (rec *recorder) WriteHeader(code int) {
	if code < 200 || rec.status != 0 {
		if code >= 100 && code < 200 && rec.through {
			rec.w.WriteHeader(code)
		}
		return
	}
	rec.status = code
	if rec.through {
		rec.w.WriteHeader(code)
	}
}

func (rec *recorder) Write(p []byte) (int, error) {
	if rec.hijacked {
		return 0, http.ErrHijacked
	}
	if rec.failed != nil {
		return 0, rec.failed
	}
	if rec.status == 0 {
		rec.WriteHeader(http.StatusOK)
	}
	if rec.through {
		return rec.w.Write(p)
	}
	if rec.spillW != nil {
		return rec.spillWrite(p)
	}
	if int64(len(rec.buf)+len(p)) > rec.max {
		rec.kept = false
		if rec.atomic {
			// Nothing may reach the client before the commit, and the
			// handler may still be reading from its transaction: the
			// rest goes to a temporary file, sent after the commit.
			f, err := os.CreateTemp("", "idem-spill-*")
			if err != nil {
				rec.failed = fmt.Errorf("idem: the answer passed the recording cap (%d bytes) and its temporary file could not be created: %w", rec.max, err)
				return 0, rec.failed
			}
			rec.spill, rec.spillW = f, bufio.NewWriterSize(f, 32<<10)
			return rec.spillWrite(p)
		}
		rec.goThrough()
		return rec.w.Write(p)
	}
	rec.buf = append(rec.buf, p...)
	return len(p), nil
}

// WriteString lets io.WriteString avoid a conversion.
func (rec *recorder) WriteString(s string) (int, error) {
	if rec.through || rec.hijacked || rec.failed != nil || rec.spillW != nil || int64(len(rec.buf)+len(s)) > rec.max {
		return rec.Write([]byte(s))
	}
	if rec.status == 0 {
		rec.WriteHeader(http.StatusOK)
	}
	rec.buf = append(rec.buf, s...)
	return len(s), nil
}

// spillWrite appends p to the temporary file (atomic mode past the cap).
func (rec *recorder) spillWrite(p []byte) (int, error) {
	n, err := rec.spillW.Write(p)
	if err != nil {
		rec.failed = fmt.Errorf("idem: the answer passed the recording cap (%d bytes) and its temporary file could not be written: %w", rec.max, err)
		return n, rec.failed
	}
	return n, nil
}

// settle ends the handler's writing before the outcome is recorded: what
// is buffered for the temporary file is written and the file rewound. It
// returns why the answer could not be spilled whole (atomic mode).
func (rec *recorder) settle() error {
	if rec.failed == nil && rec.spillW != nil {
		err := rec.spillW.Flush()
		if err == nil {
			_, err = rec.spill.Seek(0, io.SeekStart)
		}
		if err != nil {
			rec.failed = fmt.Errorf("idem: the answer passed the recording cap (%d bytes) and its temporary file could not be written: %w", rec.max, err)
		}
	}
	return rec.failed
}

// goThrough sends what is held and switches to writing through.
func (rec *recorder) goThrough() {
	rec.kept, rec.through = false, true
	if rec.status == 0 {
		rec.status = http.StatusOK
	}
	rec.w.WriteHeader(rec.status)
	if len(rec.buf) > 0 {
		_, _ = rec.w.Write(rec.buf)
		rec.buf = rec.buf[:0]
	}
	rec.sendSpill()
}

// sendSpill sends the temporary file's contents, if any (after the held
// bytes), and drops the file.
func (rec *recorder) sendSpill() {
	if rec.spill == nil {
		return
	}
	if rec.settle() == nil {
		_, _ = io.Copy(rec.w, rec.spill)
	}
	_ = rec.spill.Close()
	_ = os.Remove(rec.spill.Name())
	rec.spill, rec.spillW = nil, nil
}

// passThrough makes the recorder write through (call.supersede): what
// the nested layer that took over sends passes out as it sends it,
// streaming included. Anything already held (a status or bytes written
// before the nested layer took over) is sent first.
func (rec *recorder) passThrough() {
	switch {
	case rec.through:
	case rec.status != 0 || len(rec.buf) > 0:
		rec.goThrough()
	default:
		rec.kept, rec.through = false, true
	}
}

// Flush streams the response in leased mode (the body is then not kept);
// in atomic mode it is deferred until the transaction commits (deliver then
// sends everything, past the cap from the temporary file).
func (rec *recorder) Flush() {
	if rec.hijacked || (rec.atomic && !rec.through) {
		return
	}
	if !rec.through {
		rec.goThrough()
	}
	_ = http.NewResponseController(rec.w).Flush() // also through Unwrap chains
}

// Hijack hands the connection over in leased mode (the body is then not
// kept); atomic mode refuses it, since nothing may reach the client before
// the commit.
func (rec *recorder) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	if rec.atomic && !rec.through { // through in atomic mode: a nested layer took over
		return nil, nil, fmt.Errorf("idem: Hijack is not supported in atomic mode: %w", http.ErrNotSupported)
	}
	conn, rw, err := http.NewResponseController(rec.w).Hijack() // also through Unwrap chains
	if err == nil {
		// The handler owns the connection: what it sends is unknown. The
		// record completes with the status set before (200 when none) and
		// says the body was not kept.
		rec.hijacked, rec.kept, rec.through = true, false, true
	}
	return conn, rw, err
}

// Unwrap returns the underlying writer (for http.ResponseController).
func (rec *recorder) Unwrap() http.ResponseWriter { return rec.w }

// response fills resp with the captured response; its Header is the live
// header map (finish records only the allowlisted fields).
func (rec *recorder) response(resp *Response) {
	status := rec.status
	if status == 0 {
		status = http.StatusOK
	}
	*resp = Response{Status: status, Header: rec.w.Header(), BodyKept: rec.kept}
	if rec.kept {
		resp.Body = rec.buf
	}
}

// deliver sends the held response.
func (rec *recorder) deliver() {
	if rec.through {
		return
	}
	if rec.status == 0 {
		rec.status = http.StatusOK
	}
	rec.w.WriteHeader(rec.status)
	if len(rec.buf) > 0 {
		_, _ = rec.w.Write(rec.buf)
	}
	rec.sendSpill()
}
