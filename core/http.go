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
	"sync"
	"sync/atomic"
	"time"
)

// HeaderReplayed marks a replayed response.
const HeaderReplayed = "Idempotent-Replayed"

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

// call is the per-request state. The contexts of the request that carry
// it (Value(attemptKey{})) are how MarkEffect, Release, DownstreamKey,
// AttemptFrom and NativeFrom find it, and how a nested layer finds the
// layer it runs in.
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

	// What prepare found, for run.
	r, rc       *http.Request // the request as it came; rc: the caller function's and the fingerprinter's (see prepare)
	start       time.Time
	ev          Event // the event to emit, filled in as the request goes
	ident       Identity
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
	if c := rt.prepare(w, r, pattern, native, next); c != nil {
		rt.run(w, c, next)
	}
}

// prepare reads what identifies r and what its content is: the key, the
// scope, the caller, the body and its fingerprint. It returns nil when it
// has dealt with r already (passed it through to next, or rejected it),
// else the call that run takes on. It also takes a nested request over
// from the layer it is nested in (call.supersede).
func (rt *Route) prepare(w http.ResponseWriter, r *http.Request, pattern string, native any, next func(http.ResponseWriter, *http.Request)) *call {
	var around *call // a protected request this one runs inside of
	if outer := claimedCall(r.Context()); outer != nil {
		if !outer.writesTo(w) {
			around = outer
		} else if ctx, ok := outer.supersede(r.Context()); ok {
			r = r.WithContext(ctx)
			if err := rt.nestable(outer.att.rt, r.Method); err != nil {
				rt.Refuse(w, r, err)
				return nil
			}
		}
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
	scope, route := rt.p.scope, routeLabel(r, pattern)
	if err != nil {
		rt.reject(w, r, Event{Decision: DecisionInvalid, Scope: scope, Route: route, Err: err}, start)
		return nil
	}
	c := &call{base: r.Context(), native: native, r: r, rc: r, start: start}
	c.ctx = context.WithValue(c.base, attemptKey{}, c)
	// Until the record is claimed, the caller function and the fingerprinter
	// see the request as it came, or, when the adapter passed its framework's
	// context, a copy whose context is the call (NativeFrom finds it there).
	// The handler's request is made once the record is claimed, so a replay
	// or a rejection makes neither it nor the leased mode's cancellable
	// context.
	if native != nil {
		c.rc = r.WithContext(c.ctx)
	}
	rc := c.rc
	c.ev = Event{Scope: scope, Route: route, Key: key}
	ev := &c.ev
	caller := ""
	if e.cfg.caller != nil {
		caller, err = e.cfg.caller(rc)
		if err == nil && caller == "" {
			err = ErrNoCaller
		} else if err != nil && !errors.Is(err, ErrNoCaller) {
			err = &callerError{err: err} // the function failed: logged at WARN
		}
		if err != nil {
			ev.Decision, ev.Err = DecisionInvalid, err
			rt.reject(w, rc, *ev, start)
			return nil
		}
	}
	ev.Caller = caller
	body, err := c.body.load(r, e.cfg.maxRequest)
	if errors.Is(err, ErrBodyConsumed) {
		e.cfg.logger.ErrorContext(rc.Context(), "idempotency: the request body was read before the idempotency middleware, so it cannot be fingerprinted; "+
			"install the middleware before any middleware that reads the body (or make that middleware restore it)",
			slog.String("scope", scope), slog.String("error", err.Error()))
	}
	if err != nil {
		ev.Decision, ev.Err = DecisionInvalid, err
		rt.reject(w, rc, *ev, start)
		return nil
	}
	if rc != r {
		rc.Body = &c.body
	}
	if f := rt.p.fingerprint; f == nil {
		c.fingerprint = fingerprint(c.fp[:0], rc, scope, body, nil) // DefaultFingerprint
	} else {
		fp, err := f(rc, scope, body)
		if err != nil {
			ev.Decision, ev.Err = DecisionInvalid, &fingerprintError{err: err}
			rt.reject(w, rc, *ev, start)
			return nil
		}
		c.fingerprint = normalFingerprint(fp)
	}
	c.ident = Identity{Caller: caller, Scope: scope, Key: key}
	ev.ID = c.ident.ID()
	if rt.p.record != nil {
		if c.request, err = rt.recordRequest(r, caller, body); err != nil {
			ev.Decision, ev.Err = DecisionInvalid, clientErrorf(ErrInvalidRequest, "the fields to record could not be read from the body: %v", err)
			rt.reject(w, rc, *ev, start)
			return nil
		}
		if rt.p.name != "" && e.settler != nil {
			if c.markRequest, err = e.sealRequest(ev.ID, c.request); err != nil {
				ev.Decision, ev.Err = DecisionStoreError, storeErr(err)
				rt.reject(w, rc, *ev, start)
				return nil
			}
		}
	}
	if around != nil && around.att.id == ev.ID && (bytes.Equal(around.fingerprint, c.fingerprint) || rt.p.fingerprint != nil || around.att.rt.p.fingerprint != nil) {
		// The same request nested behind a writer without Unwrap: the same
		// identity and fingerprint (with a Fingerprint option on either
		// layer the two cannot be compared: taken over, and refused by
		// nestable, as behind a writer that unwraps). An in-process
		// sub-request to another route that forwards the client's key has
		// the identity (the scope is empty by default) but not the
		// fingerprint: it is protected on its own, and meets the outer's
		// record as a key reused for another request (422).
		if ctx, ok := around.supersede(c.base); ok {
			c.base = ctx
			c.ctx = context.WithValue(ctx, attemptKey{}, c)
			if native != nil {
				c.rc = r.WithContext(c.ctx)
			}
			if err := rt.nestable(around.att.rt, r.Method); err != nil {
				rt.Refuse(w, r, err)
				return nil
			}
		}
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

// run takes a prepared call through the state machine: it claims the
// record or answers without running (replay, rejection, fail-open), runs
// the handler through the attempt's run step, and delivers the handler's
// answer or the engine's when the outcome could not be made durable.
func (rt *Route) run(w http.ResponseWriter, c *call, next func(http.ResponseWriter, *http.Request)) {
	e := rt.e
	r, rc, ev, start := c.r, c.rc, &c.ev, c.start
	ctx := c.ctx
	att, ans := rt.acquire(ctx, c.ident, ev.ID, c.fingerprint, start, &c.att, nil)
	ev.Claim = ans.claim
	if att == nil {
		ev.Decision, ev.Err, ev.Attempt = ans.decision, ans.err, ans.rec.Attempt
		switch {
		case ans.unreachable && e.cfg.failOpen && !rt.atomic:
			ev.Err = fmt.Errorf("running WITHOUT idempotency protection (fail-open): %w", ans.err)
			e.emit(ctx, *ev, start)
			r = r.WithContext(ctx)
			r.Body = &c.body
			next(w, r)
		case ans.err != nil:
			rt.reject(w, rc, *ev, start)
		default:
			ev.Status = rt.writeReplay(w, rc, &ans.resp)
			e.emit(ctx, *ev, start)
		}
		return
	}
	c.claimed = true
	ev.Attempt = att.number
	hctx := att.ctx // atomic mode: carries the transaction
	if !rt.atomic {
		// Leased mode: the attempt outlives its client. A client that
		// disconnects does not cancel it halfway through an external
		// effect: the handler's context keeps the request's values (the
		// application's own transaction, if any, which the handler may
		// use) but not its cancellation, and ends only when the lease is
		// lost (cause ErrLeaseLost). The attempt's own store calls
		// (att.ctx) hide the store's transaction (Route.leasedCtx).
		var cancel context.CancelCauseFunc
		hctx, cancel = context.WithCancelCause(context.WithoutCancel(ctx))
		defer cancel(nil)
		att.cancel = cancel
		hctx = att.withLocalTx(hctx)
	}
	defer att.bound()()
	e.hold(att)
	r = r.WithContext(hctx)
	r.Body = &c.body
	rec := &c.rec
	rec.init(w, rt.atomic, e.cfg.maxResponse)
	defer rec.free()
	// A nested layer that took the request over (call.supersede) settles
	// its own attempt: this layer then records nothing.
	settles := func() bool { return c.phase.CompareAndSwap(phaseRunning, phaseSettled) }
	att.run(ctx, ev, start, settles, c.panicResponse, func() { next(rec, r) })
	if !settles() {
		// A nested layer protected the request with its own options and
		// its answer went out through rec untouched; this layer's claim
		// was given up before the handler ran.
		e.cfg.logger.DebugContext(ctx, "idempotency: a nested layer protected the request", slog.String("scope", ev.Scope))
		return
	}

	if err := rec.settle(); err != nil {
		// Atomic mode, and the answer past the cap could not be spilled
		// to its temporary file: the answer is incomplete, so nothing is
		// recorded; the attempt ends as a panic would (released: the
		// transaction rolls back; indeterminate after MarkEffect) and the
		// client gets the engine's 500.
		p := e.problemFor(fmt.Errorf("idem: spilling the answer past the recording cap: %w", err)) // internal: not shown
		e.cfg.logger.ErrorContext(c.ctx, "idempotency: the answer past the recording cap could not be spilled to its temporary file; the attempt ends as a panic would and the client gets 500",
			slog.String("id", c.ev.ID.String()), slog.String("error", err.Error()))
		p.RecordID = ev.ID.String()
		ferr := att.end(ev, problemResponse(p), true)
		ev.Err = errors.Join(err, ferr)
		if ferr != nil {
			// Not even that could be made durable: the store's problem
			// (503, retry).
			p = e.problemFor(ferr)
			p.RecordID = ev.ID.String()
		}
		rec.resetHeader()
		e.cfg.errorWriter(w, r, p)
		ev.Status = p.Status
		e.emit(ctx, *ev, start)
		return
	}
	resp := &c.resp
	rec.response(resp)
	att.recordAllow = e.cfg.recorded
	err := att.end(ev, resp, false)
	ev.Status = resp.Status
	if rt.atomic && errors.Is(err, ErrLostRace) && !rec.through {
		// Atomic mode, and the database rolled the transaction back for a
		// concurrent claim of the identity (another Galera node's): the
		// handler's answer is void; answer as the duplicate this was.
		rec.resetHeader()
		ans := rt.afterLostRace(ctx, ev.ID, c.fingerprint, start)
		ev.Decision, ev.Err = ans.decision, errors.Join(ans.err, err)
		if ans.err != nil {
			p := e.problemFor(ans.err)
			p.RecordID = ev.ID.String()
			e.cfg.errorWriter(w, r, p)
			ev.Status = p.Status
		} else {
			ev.Status = rt.writeReplay(w, rc, &ans.resp)
		}
	} else if err != nil && !rec.through && (rt.atomic || att.localUsed || errors.Is(err, ErrLeaseLost) || errors.Is(err, ErrOutcomePending)) {
		// Atomic mode, or leased with local writes: the outcome is not
		// durable (rolled back), so the handler's answer must not reach
		// the client. Lost lease: the new owner's answer is the one to
		// give. (Leased mode without local writes and without MarkEffect,
		// with a failing store: the handler's answer is delivered and the
		// failure logged; the record's lease will lapse.)
		rec.resetHeader()
		p := e.problemFor(err)
		p.RecordID = ev.ID.String()
		e.cfg.errorWriter(w, r, p)
		ev.Status = p.Status
	} else {
		rec.deliver()
	}
	e.emit(ctx, *ev, start)
}

// panicResponse is the answer recorded for a handler that panicked: the
// engine's 500, which does not show the panic's value.
func (c *call) panicResponse(v any) *Response {
	p := c.att.e.problemFor(fmt.Errorf("idem: the handler panicked: %v", v))
	p.RecordID = c.ev.ID.String()
	return problemResponse(p)
}

// callerError is a caller function's own failure (not "no caller"): the
// client gets 401, and since its text may name internal systems ("ldap
// bind failed ..."), it goes to the log only, at WARN.
type callerError struct{ err error }

func (e *callerError) Error() string {
	return ErrNoCaller.Error() + ": the caller function failed: " + e.err.Error()
}
func (e *callerError) Unwrap() []error { return []error{ErrNoCaller, e.err} }

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
	if !errors.Is(err, ErrNotProtected) {
		err = fmt.Errorf("%w: %w", ErrNotProtected, err)
	}
	rt.e.cfg.logger.ErrorContext(r.Context(), "idempotency: request refused", slog.String("error", err.Error()))
	rt.reject(w, r, Event{Decision: DecisionInvalid, Scope: rt.p.scope, Route: routeLabel(r, ""), Err: err}, rt.e.cfg.clock())
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
// its record never persists), its recorder turns transparent (what the
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

// ErrInvalidRequest: the request body could not be read or fingerprinted
// (HTTP 400).
var ErrInvalidRequest = errors.New("idem: request body could not be read")

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

func (rt *Route) reject(w http.ResponseWriter, r *http.Request, ev Event, start time.Time) {
	e := rt.e
	p := e.problemFor(ev.Err)
	if ev.ID != (ID{}) {
		p.RecordID = ev.ID.String()
	}
	e.cfg.errorWriter(w, r, p)
	ev.Status = p.Status
	e.emit(r.Context(), ev, start)
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

// bufPool holds the buffers of response captures (recorder) and of
// completion encodings (attempt.record). Neither is handed out beyond the
// call that uses it: a store copies Completion.Response before Complete
// returns (storetest's NoAliasing), a Sealer does not keep plain, and a
// ResponseWriter is not used after ServeHTTP returns (net/http's rule;
// http.TimeoutHandler's late handler writes to a writer of its own).
// Request bodies are not pooled: see bodyReader.
var bufPool = sync.Pool{New: func() any { b := make([]byte, 0, 4096); return &b }}

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
	buf      *[]byte
	kept     bool          // the body is complete in buf
	through  bool          // writing through to w
	spill    *os.File      // atomic mode past the cap: the rest of the answer
	spillW   *bufio.Writer // buffers writes to spill
	failed   error         // spilling failed: every write fails (settle reports it)
	hijacked bool
	// transparent: a nested layer took over (call.supersede); every call
	// goes to w unchanged.
	transparent bool
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
	rec.buf = bufPool.Get().(*[]byte)
	*rec.buf = (*rec.buf)[:0]
}

func (rec *recorder) free() {
	if rec.spill != nil {
		_ = rec.spill.Close()
		_ = os.Remove(rec.spill.Name())
		rec.spill, rec.spillW = nil, nil
	}
	if rec.buf != nil && cap(*rec.buf) <= 1<<20 {
		bufPool.Put(rec.buf)
	}
	rec.buf = nil
}

func (rec *recorder) Header() http.Header { return rec.w.Header() }

// resetHeader drops what the handler put in the response header and
// restores what was there before it ran (an outer middleware's, such as
// CORS headers a browser needs to read the answer at all), for an answer
// of the engine's own that replaces the handler's.
func (rec *recorder) resetHeader() {
	h := rec.w.Header()
	clear(h)
	for k, v := range rec.outer {
		h[k] = v
	}
}

func (rec *recorder) WriteHeader(code int) {
	if rec.transparent {
		rec.w.WriteHeader(code)
		return
	}
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
	if rec.transparent {
		return rec.w.Write(p)
	}
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
	if int64(len(*rec.buf)+len(p)) > rec.max {
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
	*rec.buf = append(*rec.buf, p...)
	return len(p), nil
}

// WriteString lets io.WriteString avoid a conversion.
func (rec *recorder) WriteString(s string) (int, error) {
	if rec.transparent {
		return io.WriteString(rec.w, s)
	}
	if rec.through || rec.hijacked || rec.failed != nil || rec.spillW != nil || int64(len(*rec.buf)+len(s)) > rec.max {
		return rec.Write([]byte(s))
	}
	if rec.status == 0 {
		rec.WriteHeader(http.StatusOK)
	}
	*rec.buf = append(*rec.buf, s...)
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
	if len(*rec.buf) > 0 {
		_, _ = rec.w.Write(*rec.buf)
		*rec.buf = (*rec.buf)[:0]
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

// passThrough makes the recorder transparent (call.supersede). Anything
// already held (a status or bytes written before the nested layer took
// over) is sent first.
func (rec *recorder) passThrough() {
	if rec.transparent {
		return
	}
	if !rec.through && (rec.status != 0 || len(*rec.buf) > 0) {
		rec.goThrough()
	}
	rec.transparent = true
}

// Flush streams the response in leased mode (the body is then not kept);
// in atomic mode it is deferred until the transaction commits (deliver then
// sends everything, past the cap from the temporary file).
func (rec *recorder) Flush() {
	if rec.transparent {
		_ = http.NewResponseController(rec.w).Flush()
		return
	}
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
	if rec.transparent {
		return http.NewResponseController(rec.w).Hijack()
	}
	if rec.atomic {
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
		resp.Body = *rec.buf
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
	if len(*rec.buf) > 0 {
		_, _ = rec.w.Write(*rec.buf)
	}
	rec.sendSpill()
}
