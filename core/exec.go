package core

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Request is one request of a transport other than HTTP, for Route.Exec:
// what an adapter (grpcidem) read from its call before the state machine
// runs.
type Request struct {
	// Key holds the values of the key's field as sent (gRPC: the
	// idempotency-key metadata); none when the request has no key. Each
	// is parsed as ParseKey does; more than one is ErrInvalidKey.
	Key []string
	// Caller names who is asking (an error or "" refuses the request with
	// ErrNoCaller, as a CallerFunc does over HTTP). nil: every request
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
func (rt *Route) Exec(ctx context.Context, req Request, fn func(ctx context.Context) *Response) (resp *Response, replayed bool, err error) {
	e := rt.e
	start := e.cfg.clock()
	ev := Event{Scope: rt.p.scope, Route: req.Route}
	// reject reports a request that does not run and returns its error.
	reject := func(err error) (*Response, bool, error) {
		p := e.problemFor(err)
		ev.Err, ev.Status = err, p.Status
		e.emit(ctx, ev, start)
		if p.RetryAfter > 0 {
			var re *RetryError
			if !errors.As(err, &re) {
				err = &RetryError{Err: err, RetryAfter: p.RetryAfter}
			}
		}
		return nil, false, err
	}
	switch len(req.Key) {
	case 0:
		if rt.p.optionalKey {
			return run(ctx, fn), false, nil
		}
		ev.Decision = DecisionInvalid
		return reject(ErrMissingKey)
	case 1:
		if ev.Key, err = ParseKey(req.Key[0]); err != nil {
			ev.Decision = DecisionInvalid
			return reject(err)
		}
	default:
		ev.Decision = DecisionInvalid
		return reject(clientErrorf(ErrInvalidKey, "the key is sent %d times", len(req.Key)))
	}
	if req.Caller != nil {
		caller, err := req.Caller(ctx)
		if err == nil && caller == "" {
			err = ErrNoCaller
		} else if err != nil && !errors.Is(err, ErrNoCaller) {
			err = &callerError{err: err} // the function failed: logged at WARN
		}
		if err != nil {
			ev.Decision = DecisionInvalid
			return reject(err)
		}
		ev.Caller = caller
	}
	var fp []byte
	if req.Fingerprint != nil {
		if fp, err = req.Fingerprint(); err != nil {
			ev.Decision = DecisionInvalid
			return reject(&fingerprintError{err: err})
		}
		fp = normalFingerprint(fp)
	}
	ident := Identity{Caller: ev.Caller, Scope: ev.Scope, Key: ev.Key}
	ev.ID = ident.ID()

	c := new(call) // holds the attempt, and is what attemptFrom finds in fn's context
	att, ans := rt.acquire(ctx, ident, ev.ID, fp, start, &c.att, nil)
	ev.Claim = ans.claim
	if att == nil {
		ev.Decision, ev.Attempt = ans.decision, ans.rec.Attempt
		if ans.unreachable && e.cfg.failOpen && !rt.atomic {
			ev.Err = fmt.Errorf("running WITHOUT idempotency protection (fail-open): %w", ans.err)
			e.emit(ctx, ev, start)
			return run(ctx, fn), false, nil
		}
		return rt.execAnswer(ctx, ev, start, ans, reject)
	}
	c.claimed = true
	ev.Attempt = att.number
	hctx := att.ctx // atomic mode: carries the transaction
	if !rt.atomic {
		// Leased mode: fn keeps ctx's values but not its cancellation; its
		// context ends when the lease is lost (see Route.Serve).
		var cancel context.CancelCauseFunc
		hctx, cancel = context.WithCancelCause(context.WithoutCancel(ctx))
		defer cancel(nil)
		att.cancel = cancel
		hctx = att.withLocalTx(hctx)
	}
	hctx = context.WithValue(hctx, attemptKey{}, c)
	defer att.bound()()
	e.hold(att)

	att.run(ctx, &ev, start, nil, func(any) *Response { ev.Status = 500; return &Response{Status: 500, BodyKept: true} },
		func() { resp = fn(hctx) })
	if resp == nil {
		resp = &Response{Status: 500}
	}
	kept := *resp
	kept.BodyKept = int64(len(resp.Body)) <= e.cfg.maxResponse
	if !kept.BodyKept {
		kept.Body = nil
	}
	ev.Status = resp.Status
	err = att.end(&ev, &kept, false)
	if rt.atomic && errors.Is(err, ErrLostRace) {
		// The database rolled the transaction back for a concurrent claim
		// (another Galera node's): fn's answer is void; answer as the
		// duplicate this was (see Route.Serve).
		ans := rt.afterLostRace(ctx, ev.ID, fp, start)
		ev.Decision, ev.Err = ans.decision, err
		if ans.err != nil {
			ans.err = errors.Join(ans.err, err)
		}
		return rt.execAnswer(ctx, ev, start, ans, reject)
	}
	if err != nil && (rt.atomic || att.localUsed || errors.Is(err, ErrLeaseLost) || errors.Is(err, ErrOutcomePending)) {
		// Not durable (atomic mode), or the new owner's answer is the one
		// to give (lost lease): fn's answer must not reach the client.
		return reject(err)
	}
	ev.Err = err // leased mode, store failing: fn's effect happened; delivered, logged
	e.emit(ctx, ev, start)
	return resp, false, nil
}

// execAnswer returns what Exec returns for a request that did not run.
func (rt *Route) execAnswer(ctx context.Context, ev Event, start time.Time, ans answer, reject func(error) (*Response, bool, error)) (*Response, bool, error) {
	if ans.err != nil {
		return reject(ans.err)
	}
	resp := ans.resp.response()
	ev.Status = resp.Status
	rt.e.emit(ctx, ev, start)
	return resp, true, nil
}

// run calls fn for a request that passes through unprotected.
func run(ctx context.Context, fn func(context.Context) *Response) *Response {
	if resp := fn(ctx); resp != nil {
		return resp
	}
	return &Response{Status: 500}
}
