package core

import (
	"context"
	"errors"

	"github.com/idemkit/idem/core/observe"
	"github.com/idemkit/idem/core/store"
)

// Request is one request of a transport other than HTTP, for Route.Exec:
// what an adapter (grpcidem) read from its call before the state machine
// runs.
type Request struct {
	// Key holds the values of the key's field as sent (gRPC: the
	// idempotency-key metadata); none when the request has no key. Each
	// is parsed as the Idempotency-Key header is (raw, or an RFC 8941
	// quoted string); more than one is ErrInvalidKey.
	Key []string
	// Caller names who is asking (an error or "" refuses the request with
	// ErrNoCaller, as the WithCaller function does over HTTP). nil: every request
	// shares one key space, so the adapter must make that an explicit
	// choice of its user (as WithSingleCaller is over HTTP).
	Caller func(ctx context.Context) (string, error)
	// Route labels the request's decisions for observability (Event.Route;
	// gRPC: the full method name). It is not part of the identity: the
	// scope is the route's Scope option, empty by default, so the
	// fingerprint must tell requests to different routes apart (gRPC's
	// covers the method).
	Route string
	// Fingerprint computes the request's fingerprint (nil: none), after the
	// key and the caller were accepted; an error refuses the request with
	// ErrInvalidRequest. Route options of HTTP requests (Fingerprint,
	// Methods) do not apply to Exec.
	Fingerprint func() ([]byte, error)
}

// Exec runs one request of a transport other than HTTP through the state
// machine, with the rules of Route.Serve: fn runs at most once per
// (caller, scope, key), and the *Response it returns is classified as an
// HTTP answer (docs/contract.md, section 4 "Outcomes": 2xx to 4xx are recorded, except 408 and
// 429; 408, 429, Release, a panic and a 5xx release the record, a 5xx or a
// panic after MarkEffect leaves it indeterminate). The adapter maps its
// transport's result to a Response (grpcidem: the gRPC code to the HTTP
// status of the same meaning) and records the headers it chooses: Exec
// records Response.Header as given (no allowlist), and the body up to
// WithMaxResponseBody (past it the record says the body was not kept).
//
// Exec returns:
//   - fn's own Response, replayed false: fn ran (or the request passed
//     through unprotected: a route with KeyOptional and no key, or
//     WithFailOpen in leased mode with the store unreachable). Its
//     outcome is recorded, and in middleware-managed atomic mode
//     committed, before Exec returns.
//   - a recorded Response, replayed true: a completed (or indeterminate, or
//     resolved) record's answer; fn did not run. BodyKept false when the
//     first body was not kept.
//   - an error, fn's answer withheld: a rejection or failure matching the
//     sentinels of Route.Serve's problem documents (ErrMissingKey,
//     ErrInvalidKey, ErrNoCaller, ErrInvalidRequest, ErrMismatch,
//     ErrInProgress, ErrLeaseLost, ErrStoreUnavailable, ErrTxAborted, ...).
//     Where HTTP would send Retry-After the error is (or wraps) a
//     *RetryError. Its text may name internal systems: show the client
//     only what the sentinel says.
//
// fn gets the attempt's context, as a handler gets its request's: in atomic
// mode it carries the transaction (sqlstore.Tx, gormstore.DB), and
// MarkEffect, Release, DownstreamKey and AttemptFrom work with it. As over
// HTTP the attempt outlives its caller: fn's context does not end when ctx
// does (a client that went away, its deadline), only at MaxAttempt or, in
// leased mode, when the lease is lost. A panic in fn is recorded as a 500
// and goes on. Every decision is reported to the Observer and the log, as
// Route.Serve's are; Event.Status is the Response's status, or the status
// Route.Serve would answer a rejection with.
func (rt *Route) Exec(ctx context.Context, req Request, fn func(ctx context.Context) *Response) (*Response, bool, error) {
	e := rt.e
	x := &execCall{ctx: ctx, fn: fn}
	c := &x.call
	c.route, c.start, c.ev = rt, e.cfg.clock(), observe.Event{Scope: rt.p.scope, Route: req.Route}
	ev := &c.ev
	refuse := func(err error) (*Response, bool, error) {
		ev.Decision, ev.Err = observe.DecisionInvalid, err
		ev.Status = x.reject(err)
		e.emit(ctx, *ev, c.start)
		return nil, false, x.err
	}
	var err error
	switch len(req.Key) {
	case 0:
		if rt.p.optionalKey {
			return run(ctx, fn), false, nil
		}
		return refuse(ErrMissingKey)
	case 1:
		if ev.Key, err = parseKey(req.Key[0]); err != nil {
			return refuse(err)
		}
	default:
		return refuse(clientErrorf(ErrInvalidKey, "the key is sent %d times", len(req.Key)))
	}
	if req.Caller != nil {
		if ev.Caller, err = callerOf(req.Caller(ctx)); err != nil {
			return refuse(err)
		}
	}
	if req.Fingerprint != nil {
		if c.fingerprint, err = req.Fingerprint(); err != nil {
			return refuse(&fingerprintError{err: err})
		}
		c.fingerprint = normalFingerprint(c.fingerprint)
	}
	c.ident = store.Identity{Caller: ev.Caller, Scope: ev.Scope, Key: ev.Key}
	ev.ID = c.ident.ID()
	c.ctx = context.WithValue(ctx, attemptKey{}, c) // what attemptFrom finds in fn's context
	rt.step(&job{c: c, ctx: c.ctx, failOpen: true}, transport{handle: x.handle, panicked: x.panicked, reply: x.reply})
	return x.resp, x.replayed, x.err
}

// execCall is Exec's transport: fn's answer, or the replay, or the error
// in its place.
type execCall struct {
	call
	ctx      context.Context
	fn       func(ctx context.Context) *Response
	resp     *Response
	replayed bool
	err      error
}

func (x *execCall) handle(hctx context.Context) (*Response, bool, error) {
	x.resp = run(hctx, x.fn)
	return capped(x.resp, x.route.e.cfg.maxResponse), false, nil
}

func (x *execCall) panicked(any) *Response {
	x.ev.Status = 500
	return &Response{Status: 500, BodyKept: true}
}

func (x *execCall) reply(res result) int {
	switch {
	case res.open:
		x.resp = run(x.ctx, x.fn)
		return 0
	case res.reject != nil && res.void != nil:
		return x.reject(errors.Join(res.reject, res.void))
	case res.reject != nil:
		return x.reject(res.reject)
	case res.replay:
		x.resp, x.replayed = res.ans.resp.response(), true
	}
	return x.resp.Status
}

// reject sets x's error to the Go form of a rejection, with the
// Retry-After HTTP would send, and returns the status HTTP would answer.
func (x *execCall) reject(err error) int {
	p := x.route.e.problemFor(err)
	x.resp, x.err = nil, err
	var re *RetryError
	if p.RetryAfter > 0 && !errors.As(err, &re) {
		x.err = &RetryError{Err: err, RetryAfter: p.RetryAfter}
	}
	return p.Status
}

// run calls fn for a request that passes through unprotected.
func run(ctx context.Context, fn func(context.Context) *Response) *Response {
	if resp := fn(ctx); resp != nil {
		return resp
	}
	return &Response{Status: 500}
}
