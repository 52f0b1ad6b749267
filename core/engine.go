package core

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Engine is the idempotency state machine over a Store. It is safe for
// concurrent use; create one per store and share it between routes.
type Engine struct {
	store  Store
	tx     TxStore // store as a TxStore; nil when the store has no transactions
	cfg    config
	def    *Route
	leases leases
	// settler is store as a Settler; nil when the store keeps no marks.
	settler Settler
	// routes are the named routes (Name), for the Completer.
	routesMu sync.Mutex
	routes   map[string]*Route
}

// New returns an engine over store. It fails with ErrConfig when neither
// WithCaller nor WithSingleCaller is given, or an option is invalid.
//
// The mode follows the store: a TxStore (gormstore, sqlstore) runs routes in
// atomic mode unless the route says Leased; any other store runs in leased
// mode.
func New(store Store, opts ...Option) (*Engine, error) {
	if store == nil {
		return nil, fmt.Errorf("%w: nil store", ErrConfig)
	}
	e := &Engine{store: store}
	e.tx, _ = store.(TxStore)
	e.settler, _ = store.(Settler)
	e.cfg = config{
		policy:      policy{retention: DefaultRetention, methods: []string{"POST", "PATCH"}, maxAttempt: DefaultMaxAttempt},
		clock:       time.Now,
		lease:       DefaultLease,
		takeover:    true,
		retryAfter:  DefaultRetryAfter,
		maxRequest:  DefaultMaxRequestBody,
		maxResponse: DefaultMaxResponseBody,
		recorded:    append([]string(nil), DefaultRecordedHeaders...),
		problemBase: DefaultProblemBase,
		errorWriter: WriteProblem,
		logger:      slog.Default(),
	}
	for _, o := range opts {
		if err := o.applyEngine(&e.cfg); err != nil {
			return nil, err
		}
	}
	for i, name := range e.cfg.recorded {
		e.cfg.recorded[i] = http.CanonicalHeaderKey(name) // "ETag" is stored as "Etag"
	}
	if e.cfg.caller == nil && !e.cfg.singleCaller {
		return nil, fmt.Errorf("%w: configure WithCaller, or WithSingleCaller if the API really has one caller (otherwise all callers would share one key space)", ErrConfig)
	}
	if e.cfg.caller != nil && e.cfg.singleCaller {
		return nil, fmt.Errorf("%w: WithCaller and WithSingleCaller exclude each other", ErrConfig)
	}
	e.def = e.Route()
	return e, nil
}

// Store returns the engine's store.
func (e *Engine) Store() Store { return e.store }

// Route is the compiled configuration of one protected route: the engine's
// defaults with the route's options applied. Adapters build one per
// middleware instance with Engine.Route and call Route.Serve per request.
type Route struct {
	e      *Engine
	p      policy
	atomic bool
}

// Route compiles route options over the engine's defaults. Invalid route
// options panic when they are created (like regexp.MustCompile): they are
// programming errors found at start-up; so does Atomic on an engine whose
// store has no transactions, here.
func (e *Engine) Route(opts ...RouteOption) *Route {
	rt := &Route{e: e, p: e.cfg.policy}
	for _, o := range opts {
		o.applyRoute(&rt.p)
	}
	rt.atomic = e.tx != nil && !rt.p.leased
	switch {
	case rt.p.atomic && rt.p.leased:
		panic(fmt.Errorf("%w: the route options Atomic and Leased exclude each other", ErrConfig))
	case rt.p.atomic && e.tx == nil:
		panic(fmt.Errorf("%w: the route asks for atomic mode (Atomic) but the engine's store, %T, has no transactions (it is not a TxStore): "+
			"use a SQL store (sqlstore, gormstore or pgxstore), or drop Atomic to run the route in leased mode", ErrConfig, e.store))
	}
	if rt.p.name != "" {
		e.register(rt)
	}
	return rt
}

// register adds the named route rt to the engine's registry. A second
// route with the same name must have been built from the same options
// (an adapter that compiles one middleware twice); otherwise it panics:
// the completer could not tell which route's resolver settles a record.
func (e *Engine) register(rt *Route) {
	if rt.p.finish != nil && rt.p.record == nil {
		panic(fmt.Sprintf("idem: route %q: Finish runs the recorded request again, so the route needs RecordRequest too", rt.p.name))
	}
	e.routesMu.Lock()
	defer e.routesMu.Unlock()
	if e.routes == nil {
		e.routes = make(map[string]*Route)
	}
	if old, ok := e.routes[rt.p.name]; ok && !old.sameSettling(rt) {
		panic(fmt.Sprintf("idem: two routes of one engine are named %q (core.Name) with different options: the completer could not tell which one settles a record; give each route a name of its own", rt.p.name))
	}
	e.routes[rt.p.name] = rt
}

// sameSettling reports whether rt and o settle records the same way: the
// same option values for the resolver, the recorded request, the
// finisher, the scope and the mode.
func (rt *Route) sameSettling(o *Route) bool {
	return rt.p.resolver == o.p.resolver && rt.p.record == o.p.record && rt.p.finish == o.p.finish &&
		rt.p.scope == o.p.scope && rt.atomic == o.atomic && rt.p.leased == o.p.leased && rt.p.retention == o.p.retention
}

// namedRoute returns the route named name, or nil.
func (e *Engine) namedRoute(name string) *Route {
	e.routesMu.Lock()
	defer e.routesMu.Unlock()
	return e.routes[name]
}

// Atomic reports whether the route runs in atomic mode.
func (rt *Route) Atomic() bool { return rt.atomic }

// Protects reports whether Serve would run r through the state machine:
// false when r's method is not covered, or when the route takes requests
// without a key (KeyOptional) and r has none; Serve then calls next with r
// untouched. Adapters that must work to find out whether the router
// routes a request (its own 404 and 405 pass through) ask first, so
// requests that pass through cost nothing.
func (rt *Route) Protects(r *http.Request) bool {
	if !rt.covers(r.Method) {
		return false
	}
	return !rt.p.optionalKey || len(r.Header[rt.e.keyHeader()]) > 0
}

// covers reports whether method is protected by the route.
func (rt *Route) covers(method string) bool {
	return slices.Contains(rt.p.methods, method)
}

// --- the state machine -----------------------------------------------------

// attempt is one execution that owns a record.
type attempt struct {
	e      *Engine
	rt     *Route
	ident  Identity
	id     ID
	token  int64
	number int
	start  time.Time
	ctx    context.Context // carries the transaction in atomic mode
	tx     Tx              // middleware-managed atomic mode: ours to commit
	joined bool            // caller-managed atomic mode: the caller's transaction
	owned  bool            // Route.Within: the service's transaction, ended when the engine settles after it
	// ltx is a leased attempt's transaction for the handler's local
	// writes, lctx the context carrying it (withLocalTx).
	ltx  Tx
	lctx context.Context
	// localUsed: the handler's local writes began in ltx, so the handler's
	// answer is true only once they committed (see Route.run).
	localUsed bool
	// panicked: the handler panicked (or its answer could not be spilled):
	// its writes are half done, so none of them commit (record).
	panicked bool
	fp       []byte // the request's fingerprint (to claim again: afterAbort)
	// expires is the claim's ExpiresAt. In atomic mode the completion
	// keeps it (expiry counts from the claim, as in leased mode until the
	// completion): the completion then changes no indexed column, which
	// lets Postgres update the row in place (a HOT update).
	expires time.Time

	// mark is the handler's MarkEffect and the attempt's settling in one
	// word (markRunning, markEffect, markSettled, markSettledEffect), so
	// that a MarkEffect after the outcome was classified fails instead of
	// being ignored (a handler behind http.TimeoutHandler that outlives
	// its attempt): see MarkEffect and classify.
	mark atomic.Int32
	// recordAllow filters the headers finish records: the allowlist for a
	// captured response, nil for responses the engine built.
	recordAllow []string
	release     atomic.Bool // the handler asked to release the record

	// leased mode: the engine's heartbeat extends the lease while the
	// attempt is held (see lease.go) and cancels the handler's context with
	// ErrLeaseLost when a takeover fenced it.
	lost atomic.Bool
	// stop releases the MaxAttempt timer of a middleware-managed atomic
	// attempt (a no-op otherwise); expired: MaxAttempt passed, the lease
	// is no longer extended.
	stop    func()
	expired atomic.Bool
	cancel  context.CancelCauseFunc

	// finish ran (atomic mode: at the response cap, before the handler
	// returned): later calls return its result.
	finished bool
	verdict  verdict // how the handler ended (set by finish)
	decision Decision
	err      error
	complete time.Duration // how long finish took (Event.Complete)
}

// answer is the engine's decision for a request that did not get to run:
// either a recorded response to replay or an error to reject with.
type answer struct {
	rec      Record
	resp     recorded // the response to replay
	err      error
	decision Decision
	// unreachable: the store could not be asked (Begin or Claim failed),
	// the only StoreError that fail-open may run the handler for. A
	// record that was read but cannot be opened or settled is not one:
	// running the handler again could repeat its effect.
	unreachable bool
	// claim is how long acquire took (Event.Claim), set for a claimed
	// attempt too.
	claim time.Duration
}

// claimRequest builds the store request for identity ident.
func (rt *Route) claimRequest(ident Identity, id ID, fp []byte, now time.Time) ClaimRequest {
	req := ClaimRequest{
		ID: id, Caller: debugString(ident.Caller), Scope: debugString(ident.Scope), Key: debugString(ident.Key),
		Fingerprint: fp, Token: newToken(), Now: now, ExpiresAt: now.Add(rt.p.retention),
	}
	if !rt.atomic {
		req.LeaseUntil = now.Add(rt.e.cfg.lease)
		if req.ExpiresAt.Before(req.LeaseUntil) {
			req.ExpiresAt = req.LeaseUntil
		}
	}
	return req
}

func newToken() int64 {
	for {
		if t := int64(rand.Uint64() >> 1); t != 0 {
			return t
		}
	}
}

// acquire claims ident, or decides how to answer without running. It
// implements the in-flight policy: reject at once, or poll (outside any
// transaction, so waiting duplicates hold no connection) until the wait bound.
//
// A claimed attempt is written to dst (the caller's call holds it) and
// returned; cancel, when not nil, cancels the context the handler will run
// with (leased mode: on a lost lease).
//
// In leased mode every store call (the claim, the resolver's, and later
// the attempt's extensions and completion, through attempt.ctx) runs with
// the store's transaction hidden (TxStore.WithoutTx): the record commits on
// its own connection, whatever transaction the request's context carries
// (a transaction-per-request middleware's), so a rollback of that
// transaction cannot take the record with it (docs/contract.md, section 5 "Atomic and leased modes").
func (rt *Route) acquire(ctx context.Context, ident Identity, id ID, fp []byte, start time.Time, dst *attempt, cancel context.CancelCauseFunc) (att *attempt, ans answer) {
	e := rt.e
	began := e.cfg.clock()
	defer func() { ans.claim = e.cfg.clock().Sub(began) }()
	joined := rt.atomic && e.tx.InTx(ctx)
	sctx := rt.leasedCtx(ctx)
	deadline := start.Add(rt.p.wait)
	backoff := 5 * time.Millisecond
	// A lapsed lease is taken over only after the engine has compared the
	// fingerprints: the first claim never takes over; a second one does,
	// when the lapsed record's request matches this one.
	takeover := false
	for {
		now := e.cfg.clock()
		req := rt.claimRequest(ident, id, fp, now)
		req.Takeover, takeover = takeover, false
		if rt.p.name != "" && e.settler != nil {
			req.Mark = rt.mark(ctx, now) // written with the claim, atomically
		}
		cctx, tx, stop := sctx, Tx(nil), func() {}
		if rt.atomic && !joined {
			// The attempt outlives its client, as in leased mode: a client
			// that goes away (the request's context ends) neither rolls the
			// transaction back nor cancels the handler, whose claim must
			// hold until it ends, or a retry meanwhile would run it again
			// (after MarkEffect: a second charge). It records its answer
			// for the retry. MaxAttempt bounds it instead.
			var bctx context.Context
			bctx, stop = rt.bounded(context.WithoutCancel(ctx))
			var err error
			cctx, tx, err = e.tx.Begin(bctx)
			if err != nil {
				stop()
				return nil, answer{err: storeErr(err), decision: DecisionStoreError, unreachable: true}
			}
		}
		res, err := e.store.Claim(cctx, req)
		if err == nil && res.Claimed {
			*dst = attempt{e: e, rt: rt, ident: ident, id: id, token: req.Token, number: res.Record.Attempt,
				start: start, ctx: cctx, tx: tx, joined: joined, fp: fp, expires: req.ExpiresAt, cancel: cancel, stop: stop}
			return dst, answer{}
		}
		if tx != nil {
			_ = tx.Rollback() // nothing written: release the connection before deciding
		}
		stop()
		if errors.Is(err, ErrLostRace) {
			// Another transaction (on a multi-primary cluster, another
			// node) claimed the identity first and the database rolled
			// this claim back: a duplicate of an attempt in flight. In the
			// caller's transaction, which is dead (ErrTxAborted too), the
			// error matches ErrInProgress, ErrLostRace and ErrTxAborted:
			// the caller rolls back and retries later.
			if joined {
				return nil, answer{rec: Record{ID: id, State: StateInProgress}, err: &RetryError{Err: fmt.Errorf("%w: %w", ErrInProgress, err), RetryAfter: e.cfg.retryAfter}, decision: DecisionRejectedBusy}
			}
			res, err = ClaimResult{Record: Record{ID: id, State: StateInProgress}}, nil
		}
		if err != nil && joined && errors.Is(err, ErrTxAborted) {
			return nil, answer{err: err, decision: DecisionStoreError} // the caller's transaction is dead: only the caller can roll it back
		}
		if errors.Is(err, ErrConfig) {
			// The store refused the combination (for example a leased claim
			// beside a SQLite transaction it would wait for): a
			// configuration error, never a reason to fail open.
			return nil, answer{err: err, decision: DecisionStoreError}
		}
		if err != nil {
			return nil, answer{err: storeErr(err), decision: DecisionStoreError, unreachable: true}
		}
		rec := res.Record
		if len(fp) > 0 && len(rec.Fingerprint) > 0 && !bytes.Equal(fp, rec.Fingerprint) {
			return nil, answer{rec: rec, err: ErrMismatch, decision: DecisionMismatch}
		}
		switch rec.State {
		case StateCompleted:
			return nil, rt.replay(sctx, rec)
		case StateIndeterminate:
			a, retry := rt.resolve(sctx, rec)
			if !retry {
				return nil, a
			}
			continue // resolved as not applied: the record is gone, claim again
		}
		// In progress.
		if !rec.LeaseUntil.IsZero() && !rec.LeaseUntil.After(now) {
			if e.cfg.takeover {
				takeover = true // the same request: take the lapsed lease over
				continue
			}
			// A lapsed lease without takeover: the attempt died and may have
			// had an effect. Settle it as indeterminate, then resolve.
			e.markIndeterminate(sctx, rec)
			continue
		}
		if rt.abandonedClaim(rec, now) {
			// A committed atomic claim that no attempt can still hold: a
			// handler committed the shared transaction itself and its
			// process died before the engine recorded the answer (or a
			// caller committed its transaction after Once failed). Its
			// writes are durable and may include an effect: indeterminate,
			// never run again blindly, never locked until expiry.
			e.markIndeterminate(sctx, rec)
			continue
		}
		if rt.p.wait <= 0 || !now.Before(deadline) || joined {
			return nil, answer{rec: rec, err: &RetryError{Err: ErrInProgress, RetryAfter: e.busyRetryAfter(rec, now)}, decision: DecisionRejectedBusy}
		}
		wait := min(backoff, deadline.Sub(now))
		backoff = min(2*backoff, 100*time.Millisecond)
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, answer{rec: rec, err: &RetryError{Err: ErrInProgress, RetryAfter: e.cfg.retryAfter}, decision: DecisionRejectedBusy}
		case <-t.C:
		}
	}
}

// mark is the mark that a claim of the route made at now writes with its
// record (ClaimRequest.Mark): the route's name and the recorded request
// that ctx's call carries (a finisher's: also its tries). The completer
// first looks at the record a lease after the claim: most attempts have
// completed by then.
func (rt *Route) mark(ctx context.Context, now time.Time) *Mark {
	m := &Mark{Route: rt.p.name, After: now.Add(rt.e.cfg.lease)}
	if c, ok := ctx.Value(attemptKey{}).(*call); ok {
		m.Request, m.Tries = c.markRequest, c.markTries
	}
	return m
}

// busyRetryAfter is the Retry-After of a 409 in-progress for rec, read at
// now. A holder alive anywhere extends its lease a whole lease ahead every
// third of it, so it always has more than half of it left (two thirds, less
// the store's latency); a lease with less left has missed heartbeats: its
// holder died, hangs, lost the store, or is past MaxAttempt. Then the wait
// is the time until the lease lapses (the problem document rounds it up to
// whole seconds: never earlier than this engine would take it over, and
// less than half a lease). Otherwise, and in atomic mode (no lease), the
// configured default. A holder wrongly judged dead (a heartbeat delayed by
// a slow store) only makes its duplicates wait longer, never earlier.
func (e *Engine) busyRetryAfter(rec Record, now time.Time) time.Duration {
	if left := rec.LeaseUntil.Sub(now); !rec.LeaseUntil.IsZero() && left < e.cfg.lease/2 {
		return left
	}
	return e.cfg.retryAfter
}

// leasedCtx is ctx for the route's store calls outside an atomic
// transaction. In leased mode it keeps ctx's values but not its
// cancellation (the attempt outlives its client: its record must be
// written whatever happens to the request), with any transaction of the
// store that ctx carries hidden (see acquire).
func (rt *Route) leasedCtx(ctx context.Context) context.Context {
	if rt.atomic {
		return ctx
	}
	ctx = context.WithoutCancel(ctx)
	if rt.e.tx != nil {
		ctx = rt.e.tx.WithoutTx(ctx)
	}
	return ctx
}

// bound starts the attempt's MaxAttempt bound and returns the function
// that ends it, once the attempt has finished. Atomic mode: the
// transaction's context carries the bound (Route.bounded); the returned
// function releases its timer. Leased mode: at the bound the handler's
// context is cancelled (cause ErrAttemptTimeout) and the heartbeat stops
// extending the lease, which lapses, so a retry can take over.
func (a *attempt) bound() func() {
	if !a.rt.atomic && a.rt.p.maxAttempt > 0 && a.cancel != nil {
		t := time.AfterFunc(a.rt.p.maxAttempt, func() {
			a.expired.Store(true)
			a.cancel(ErrAttemptTimeout)
		})
		return func() { t.Stop() }
	}
	if a.stop != nil {
		return a.stop
	}
	return func() {}
}

// bounded returns ctx ending at the route's MaxAttempt (cause
// ErrAttemptTimeout), and the function that releases its timer.
func (rt *Route) bounded(ctx context.Context) (context.Context, func()) {
	if rt.p.maxAttempt <= 0 {
		return ctx, func() {}
	}
	ctx, cancel := context.WithTimeoutCause(ctx, rt.p.maxAttempt, ErrAttemptTimeout)
	return ctx, cancel
}

func storeErr(err error) error {
	if errors.Is(err, ErrStoreUnavailable) {
		return err
	}
	return fmt.Errorf("%w: %w", ErrStoreUnavailable, err)
}

// replay answers from a recorded response.
func (rt *Route) replay(_ context.Context, rec Record) answer {
	resp, err := rt.e.openResponse(rec.ID, rec.Response)
	if err != nil {
		return answer{rec: rec, err: storeErr(err), decision: DecisionStoreError}
	}
	return answer{rec: rec, resp: resp, decision: DecisionReplayed}
}

// Resolution is a Resolver's verdict on an indeterminate record.
type Resolution struct {
	// Outcome is OutcomeUnresolved, OutcomeApplied or OutcomeNotApplied.
	Outcome Outcome
	// Response replaces the recorded one when Outcome is OutcomeApplied (for
	// example the 201 the handler would have sent).
	Response *Response
}

// Outcome of a Resolver.
type Outcome int

const (
	// OutcomeUnresolved: still unknown; the recorded 5xx is replayed.
	OutcomeUnresolved Outcome = iota
	// OutcomeApplied: the effect happened; the record completes with Response.
	OutcomeApplied
	// OutcomeNotApplied: nothing happened; the record is released and the request
	// runs.
	OutcomeNotApplied
)

// Resolver settles an indeterminate record, for example by asking the
// payment provider about the downstream key of the failed attempt
// (DownstreamKeyFor). It is called for a duplicate that meets the record,
// with that request's context, and by the Completer (Name) without a
// client. ResolvingRequest(ctx) gives it the request the record settles
// (RecordRequest). On a store with transactions it runs in a transaction
// of the store (begun lazily: nothing is sent unless it writes), reached
// with the store's accessors (sqlstore.Tx, gormstore.DB, pgxstore.Tx):
// the engine records its answer (the completion, or the release of a
// record not applied) in that transaction and commits it, so what the
// resolver writes (the payment it learnt of) and the record's answer are
// one commit; an unresolved answer or an error rolls it back. A route in
// atomic mode whose request carries the caller's transaction resolves in
// that transaction instead.
type Resolver func(ctx context.Context, rec Record) (Resolution, error)

// resolverError is a failure of the resolver function itself (not of the
// store): logged at WARN, the record stays as it is.
type resolverError struct{ err error }

func (e *resolverError) Error() string { return "the resolver failed: " + e.err.Error() }
func (e *resolverError) Unwrap() error { return e.err }

// applyResolver asks the route's resolver about rec (in progress with a
// lapsed lease, or indeterminate) and records its answer, fenced by
// rec.Token, in the resolver's transaction (see Resolver): OutcomeApplied
// with a response completes the record, OutcomeNotApplied releases it.
// It returns the outcome (OutcomeUnresolved also for an applied answer
// without a response), and an error: a *resolverError when the resolver
// failed, one wrapping ErrFenced when another settler changed the record
// first (nothing of the resolver's transaction commits then), else a
// store failure.
func (rt *Route) applyResolver(ctx context.Context, rec Record, req *RecordedRequest) (Outcome, error) {
	e := rt.e
	rctx, tx := ctx, Tx(nil)
	if e.tx != nil && !e.tx.InTx(ctx) {
		var err error
		if rctx, tx, err = e.tx.Begin(ctx); err != nil {
			return OutcomeUnresolved, err
		}
	}
	end := func(commit bool) error {
		if tx == nil {
			return nil
		}
		if commit {
			return tx.Commit()
		}
		_ = tx.Rollback()
		return nil
	}
	if req != nil {
		rctx = context.WithValue(rctx, resolvingKey{}, req)
	}
	res, err := (*rt.p.resolver)(rctx, rec)
	if err != nil {
		_ = end(false)
		return OutcomeUnresolved, &resolverError{err: err}
	}
	switch {
	case res.Outcome == OutcomeNotApplied:
		err = e.store.Release(rctx, rec.ID, rec.Token)
	case res.Outcome == OutcomeApplied && res.Response != nil:
		// The resolver's answer is recorded whole (up to the recording
		// cap), as an operator's is.
		resp := *res.Response
		resp.BodyKept = int64(len(resp.Body)) <= e.cfg.maxResponse
		if !resp.BodyKept {
			resp.Body = nil
		}
		var blob []byte
		if blob, err = e.sealResponse(rec.ID, &resp, e.cfg.recorded); err == nil {
			err = e.store.Complete(rctx, rec.ID, rec.Token, Completion{State: StateCompleted, Status: resp.Status,
				Response: blob, ExpiresAt: e.cfg.clock().Add(rt.p.retention)})
		}
	default:
		_ = end(false)
		return OutcomeUnresolved, nil
	}
	if err == nil {
		err = end(true)
	} else {
		_ = end(false)
	}
	if errors.Is(err, ErrLostRace) {
		// The database rolled the resolver's transaction back for a
		// concurrent one (on Galera: another node's settler of this
		// record was certified first): another settler won.
		err = fmt.Errorf("%w: %w", ErrFenced, err)
	}
	return res.Outcome, err
}

// resolve handles an indeterminate record. retry reports that the record
// was released and the caller should claim again.
func (rt *Route) resolve(ctx context.Context, rec Record) (a answer, retry bool) {
	e := rt.e
	if rt.p.resolver != nil && *rt.p.resolver != nil {
		var req *RecordedRequest
		if c, ok := ctx.Value(attemptKey{}).(*call); ok {
			req = c.request
		}
		outcome, err := rt.applyResolver(ctx, rec, req)
		var re *resolverError
		switch {
		case errors.As(err, &re):
			e.cfg.logger.WarnContext(ctx, "idempotency resolver failed", slog.String("id", rec.ID.String()), slog.String("error", re.err.Error()))
		case err != nil && !errors.Is(err, ErrFenced):
			return answer{rec: rec, err: storeErr(err), decision: DecisionStoreError}, false
		case outcome == OutcomeNotApplied:
			return answer{}, true // released (by us, or by another settler): claim again
		case outcome == OutcomeApplied:
			// Settled (by us, or concurrently by another settler): read back.
			got, err := e.store.Get(ctx, rec.ID, e.cfg.clock())
			if errors.Is(err, ErrNotFound) {
				return answer{}, true // expired or released meanwhile: claim again
			}
			if err != nil {
				return answer{rec: rec, err: storeErr(err), decision: DecisionStoreError}, false
			}
			if got.State != StateCompleted {
				return answer{}, true // another attempt holds it now: claim again, and decide from what it is
			}
			a := rt.replay(ctx, got)
			a.decision = DecisionResolved
			return a, false
		}
	}
	a = rt.replay(ctx, rec)
	if a.err == nil {
		a.decision = DecisionIndeterminate
	}
	return a, false
}

// abandonedClaim reports whether rec is an atomic-mode claim (in progress,
// no lease) that was committed, so its row is visible (a store's probe of
// an uncommitted claim returns neither token nor creation time), and
// older than the route's MaxAttempt: every attempt ends by then (its
// context does, and with it its transaction), so nothing can still be
// completing it. With MaxAttempt turned off nothing is assumed.
func (rt *Route) abandonedClaim(rec Record, now time.Time) bool {
	return rec.LeaseUntil.IsZero() && rec.Token != 0 && !rec.CreatedAt.IsZero() &&
		rt.p.maxAttempt > 0 && !now.Before(rec.CreatedAt.Add(rt.p.maxAttempt))
}

// markIndeterminate turns an in-progress record whose lease lapsed into an
// indeterminate one (WithoutTakeover()), or an abandoned atomic claim
// (Route.abandonedClaim).
func (e *Engine) markIndeterminate(ctx context.Context, rec Record) {
	p := e.problemFor(clientErrorf(ErrIndeterminate, "the attempt holding the key stopped before recording an outcome"))
	p.RecordID = rec.ID.String()
	resp := problemResponse(p)
	blob, err := e.sealResponse(rec.ID, resp, nil)
	if err == nil {
		err = e.store.Complete(ctx, rec.ID, rec.Token, Completion{State: StateIndeterminate, Status: resp.Status,
			Response: blob, ExpiresAt: e.cfg.clock().Add(e.cfg.policy.retention)})
	}
	if err != nil && !errors.Is(err, ErrFenced) {
		e.cfg.logger.ErrorContext(ctx, "idempotency: marking a lapsed record indeterminate", slog.String("error", err.Error()))
	}
}

// --- running an attempt ----------------------------------------------------

// verdict is how an attempt ended.
type verdict uint8

const (
	vComplete verdict = iota
	vRelease
	vIndeterminate
)

// run is the run step Serve and Once share: it calls handler, and when
// the handler panics it ends the attempt as a panic's (classify, finish,
// with panicResponse's answer recorded), emits ev and panics on. settles,
// when not nil, is asked first whether this layer still settles the
// attempt (false: a nested layer took the request over and settled its
// own). A handler that returns is ended by the caller with end, which
// knows what it answered.
func (a *attempt) run(ctx context.Context, ev *Event, start time.Time, settles func() bool, panicResponse func(v any) *Response, handler func()) {
	panicked := true
	defer func() {
		if !panicked || (settles != nil && !settles()) {
			return
		}
		v := recover()
		a.end(ev, panicResponse(v), true)
		a.e.emit(ctx, *ev, start)
		panic(v)
	}()
	handler()
	panicked = false
}

// end classifies how the handler ended (resp's status, or a panic),
// records the outcome (finish) and puts the decision and finish's error in
// ev. It returns finish's error.
func (a *attempt) end(ev *Event, resp *Response, panicked bool) error {
	var err error
	a.panicked = panicked
	ev.Decision, err = a.finish(a.classify(resp.Status, panicked), resp)
	ev.Err, ev.Complete = err, a.complete
	return err
}

// States of attempt.mark.
const (
	markRunning       int32 = iota // the handler runs, no effect marked
	markEffect                     // the handler runs, an effect was marked
	markSettled                    // the outcome was classified without an effect
	markSettledEffect              // the outcome was classified after an effect
)

// effect reports whether the handler marked an external effect.
func (a *attempt) effect() bool {
	m := a.mark.Load()
	return m == markEffect || m == markSettledEffect
}

// markEffect records the handler's MarkEffect; it reports false once the
// attempt's outcome was classified (the mark came too late to count).
func (a *attempt) markEffect() bool {
	for {
		switch m := a.mark.Load(); m {
		case markEffect:
			return true
		case markSettled, markSettledEffect:
			return false
		default:
			if a.mark.CompareAndSwap(m, markEffect) {
				return true
			}
		}
	}
}

// settle ends the handler's say over the effect: from now on MarkEffect
// fails. It reports whether an effect was marked.
func (a *attempt) settle() bool {
	for {
		switch m := a.mark.Load(); m {
		case markSettled:
			return false
		case markSettledEffect:
			return true
		default:
			if a.mark.CompareAndSwap(m, m+2) {
				return m == markEffect
			}
		}
	}
}

// classify maps a handler's result to the record's fate (docs/contract.md,
// section 4 "Outcomes"). The question that decides is "may an effect have
// happened?": after MarkEffect nothing is released (Release included),
// and every answer other than a recorded 2xx-4xx is indeterminate;
// before it, a 5xx, a panic, 408, 429 and a validation failure (400, 422:
// execution never began) release the key.
func (a *attempt) classify(status int, panicked bool) verdict {
	if a.settle() {
		switch {
		case panicked || status >= 500 || status == 408 || status == 429:
			return vIndeterminate
		}
		return vComplete
	}
	switch {
	case a.release.Load(), panicked, status >= 500:
		return vRelease
	case status == 400, status == 408, status == 422, status == 429:
		return vRelease
	}
	return vComplete
}

// finish records the outcome and, in middleware-managed atomic mode,
// commits or rolls back. It returns the decision, and an error when the
// outcome could not be made durable: the client must then not see the
// handler's answer. It acts once: a second call returns the first call's
// result.
func (a *attempt) finish(v verdict, resp *Response) (Decision, error) {
	if !a.finished {
		a.verdict = v
		began := a.e.cfg.clock()
		a.decision, a.err = a.record(v, resp)
		a.complete = a.e.cfg.clock().Sub(began)
		a.finished = true
	}
	return a.decision, a.err
}

// record is finish's work.
func (a *attempt) record(v verdict, resp *Response) (Decision, error) {
	e := a.e
	lost := e.unhold(a)
	local := a.localTx(v == vRelease || lost) // leased mode: the handler's local writes
	if v == vRelease && a.tx != nil && resp != nil && resp.Status >= 500 {
		if err := a.lostClaim(); err != nil {
			_ = a.tx.Rollback()
			return DecisionRejectedBusy, &RetryError{Err: fmt.Errorf("%w: %w", ErrInProgress, err), RetryAfter: e.cfg.retryAfter}
		}
	}
	if v == vRelease {
		var err error
		switch {
		case a.tx != nil:
			if err = a.tx.Rollback(); err != nil {
				// The transaction had ended before (the handler committed
				// or rolled it back itself, the client went away): what
				// it left is read back and settled (afterEnd).
				return a.afterEnd(v, resp, err)
			}
		default: // leased, or the caller's transaction: delete our claim
			err = e.store.Release(a.storeCtx(), a.id, a.token)
		}
		if errors.Is(err, ErrFenced) {
			// Taken over meanwhile: the new owner's record stays; the
			// handler's answer (nothing happened) is still true.
			return DecisionLeaseLost, nil
		}
		if err != nil {
			msg := "idempotency: releasing a record failed; it stays in progress until its lease lapses"
			if a.joined {
				msg = "idempotency: releasing a record in the caller's transaction failed; roll that transaction back to release it"
			}
			e.cfg.logger.Error(msg, slog.String("id", a.id.String()), slog.String("error", err.Error()))
		}
		return DecisionReleased, nil
	}
	if lost {
		if a.tx != nil {
			_ = a.tx.Rollback()
		}
		return DecisionLeaseLost, &RetryError{Err: ErrLeaseLost, RetryAfter: e.cfg.retryAfter}
	}
	if a.panicked && a.tx != nil {
		// Middleware-managed atomic mode, a panic after MarkEffect: the
		// handler's writes are half done (a debit without its credit), so
		// none of them commit; the indeterminate outcome is recorded in a
		// transaction of the engine's own (all or nothing, as a crash).
		_ = a.tx.Rollback()
		return a.afterAbort(v, resp, errPanicked)
	}
	c := Completion{State: StateCompleted, Status: resp.Status, ExpiresAt: a.completionExpiry()}
	decision := DecisionExecuted
	if v == vIndeterminate {
		c.State, decision = StateIndeterminate, DecisionIndeterminate
	}
	// The encoding goes into a pooled buffer: a store keeps its own copy
	// of Completion.Response (the conformance suite's NoAliasing), so the
	// buffer is free again when Complete returns.
	buf := bufPool.Get().(*[]byte)
	blob, err := e.sealInto((*buf)[:0], a.id, resp, a.recordAllow)
	if err == nil {
		c.Response = blob
		cctx := a.storeCtx()
		if local != nil {
			cctx = a.lctx // the completion commits with the handler's local writes
		}
		err = e.store.Complete(cctx, a.id, a.token, c)
	}
	if len(blob) > 0 && e.cfg.sealer == nil {
		*buf = blob[:0] // grown, perhaps
	}
	if cap(*buf) <= 1<<20 {
		bufPool.Put(buf)
	}
	if err == nil && a.tx != nil {
		err = a.tx.Commit()
	}
	if local != nil {
		committing := err == nil
		if committing {
			err = local.Commit()
		} else {
			_ = local.Rollback() // fenced (a takeover owns the record) or failing: none of it commits
		}
		if err != nil && !errors.Is(err, ErrFenced) {
			// The local transaction ended other than by our commit: the
			// record (on its own connection) tells what happened.
			return a.afterLocalEnd(v, resp, err, committing)
		}
	}
	if err != nil {
		if a.tx != nil && !errors.Is(err, ErrLostRace) {
			// Middleware-managed atomic mode: the transaction ended other
			// than by our commit (a constraint checked at COMMIT, a dead
			// session, a deadlock victim, the handler's own Commit or
			// Rollback, a COMMIT whose answer was lost): the record tells
			// what happened.
			return a.afterEnd(v, resp, err)
		}
		if a.tx != nil {
			_ = a.tx.Rollback()
		}
		if errors.Is(err, ErrFenced) && !a.joined {
			return DecisionLeaseLost, &RetryError{Err: ErrLeaseLost, RetryAfter: e.cfg.retryAfter}
		}
		if a.rt.atomic && errors.Is(err, ErrLostRace) && (a.tx == nil || !a.effect()) {
			// The database rolled the transaction back in favour of a
			// concurrent one (on Galera: another node's claim of this
			// identity won certification). The handler's writes are gone:
			// this attempt is a duplicate after all (see afterLostRace).
			// Checked before ErrTxAborted, which a lost race in a
			// transaction matches too. After MarkEffect, afterAbort
			// records the attempt as indeterminate instead, unless
			// another attempt holds the identity.
			return DecisionRejectedBusy, &RetryError{Err: fmt.Errorf("%w: %w", ErrInProgress, err), RetryAfter: e.cfg.retryAfter}
		}
		if a.tx != nil {
			return a.afterEnd(v, resp, err) // a lost race after MarkEffect
		}
		if a.joined && (errors.Is(err, ErrTxAborted) || errors.Is(err, ErrFenced)) {
			// The caller's transaction is dead (or the server rolled it
			// back under it, taking the claim: a MariaDB deadlock
			// victim): only the caller can roll it back.
			if !errors.Is(err, ErrTxAborted) {
				err = fmt.Errorf("%w: the claim is gone from the transaction: %w", ErrTxAborted, err)
			}
			return DecisionStoreError, &RetryError{Err: err, RetryAfter: e.cfg.retryAfter}
		}
		if !a.rt.atomic && a.effect() {
			// Leased mode: the effect may have happened and its answer is
			// not recorded. The client is told to come back for the
			// outcome (a takeover settles it, with its downstream keys),
			// never given an unrecorded answer it may not retry.
			e.cfg.logger.Error("idempotency: the answer after MarkEffect could not be recorded; the client is told its outcome is being settled",
				slog.String("id", a.id.String()), slog.Int("status", resp.Status), slog.String("error", err.Error()))
			return DecisionStoreError, &RetryError{Err: fmt.Errorf("%w: %w", ErrOutcomePending, err), RetryAfter: e.cfg.retryAfter}
		}
		return DecisionStoreError, &RetryError{Err: storeErr(err), RetryAfter: e.cfg.retryAfter}
	}
	return decision, nil
}

// errPanicked is the cause afterAbort is given for a handler that panicked
// after MarkEffect (its transaction is rolled back by the engine).
var errPanicked = errors.New("idem: the handler panicked after MarkEffect; its writes were rolled back")

// withLocalTx gives the handler of a leased attempt on a TxStore, when
// hctx carries no transaction of the store (no transaction-per-request
// middleware's), a transaction of the store for its local writes, reached
// through the store's accessors (sqlstore.Tx, gormstore.DB, pgxstore.Tx) as
// in atomic mode: the attempt's completion commits in it (docs/contract.md,
// section 5 "The result commits with the completion"). The claim has
// committed on its own connection already, so an external call before the
// writes is covered by the lease, and a takeover after a crash finds
// either the record completed with the writes (and replays it) or neither
// (and repeats the external call with its downstream key). The store's
// BEGIN is deferred to the first statement: a handler that writes nothing
// costs nothing, and its completion runs on its own as before. The
// transaction ends with hctx: a lost lease rolls the writes back.
func (a *attempt) withLocalTx(hctx context.Context) context.Context {
	e := a.e
	if a.rt.atomic || e.tx == nil || e.tx.InTx(hctx) {
		return hctx
	}
	lctx, tx, err := e.tx.Begin(hctx)
	if err != nil {
		e.cfg.logger.WarnContext(hctx, "idempotency: the leased attempt's transaction for its local writes could not begin; the handler runs without one",
			slog.String("id", a.id.String()), slog.String("error", err.Error()))
		return hctx
	}
	a.ltx, a.lctx = tx, lctx
	return lctx
}

// localTx returns the leased attempt's transaction of local writes
// (withLocalTx) that the completion is to commit with, or nil: when there
// is none, when the handler never began it (it is ended at once), and when
// discard is set (released, or the lease was lost: nothing of it commits).
func (a *attempt) localTx(discard bool) Tx {
	tx := a.ltx
	if tx == nil {
		return nil
	}
	a.ltx = nil
	if b, ok := tx.(interface{ Begun() bool }); discard || (ok && !b.Begun()) {
		_ = tx.Rollback()
		return nil
	}
	a.localUsed = true
	if a.panicked {
		// A panic leaves the handler's writes half done (a debit without
		// its credit): none of them commit; the completion runs on the
		// record's own connection.
		_ = tx.Rollback()
		return nil
	}
	return tx
}

// lostClaim reports (as an error wrapping ErrLostRace) that the database
// already rolled back the transaction of an attempt in middleware-managed
// atomic mode whose handler answered 5xx: on a multi-primary cluster
// (Galera) another node's claim of the identity aborts this transaction,
// and the handler's next statement is the one that fails, so the handler's
// 5xx is the lost race's doing. Read in the transaction, the claim is then
// gone (or the read fails with ErrLostRace); on a healthy transaction it is
// the attempt's own, and nil is returned (as for any other failure of the
// read, such as Postgres refusing statements after a failed one).
func (a *attempt) lostClaim() error {
	rec, err := a.e.store.Get(a.storeCtx(), a.id, a.e.cfg.clock())
	switch {
	case errors.Is(err, ErrLostRace):
		return err
	case errors.Is(err, ErrNotFound):
		return fmt.Errorf("%w: the transaction's claim is gone", ErrLostRace)
	case err == nil && rec.Token != a.token:
		return fmt.Errorf("%w: the identity is held by another attempt", ErrLostRace)
	}
	return nil
}

// afterLostRace answers an attempt in atomic mode whose transaction the
// database rolled back for a concurrent claim of the same identity
// (ErrLostRace from Complete or Commit; on Galera, the other node's claim
// was certified first). Nothing of the attempt persists, so it is answered
// as a duplicate: the winner's recorded response once this node sees it,
// else 409 with Retry-After; under the wait policy it polls (outside any
// transaction) until the winner's outcome is visible or the bound passes.
// It never runs the handler again.
func (rt *Route) afterLostRace(ctx context.Context, id ID, fp []byte, start time.Time) answer {
	e := rt.e
	// The reads do not end with the client (it may have gone: its answer
	// is recorded for its retry either way); the polls under the wait
	// policy do.
	wait := ctx
	ctx = context.WithoutCancel(ctx)
	if e.tx != nil {
		ctx = e.tx.WithoutTx(ctx)
	}
	deadline := start.Add(rt.p.wait)
	backoff := 5 * time.Millisecond
	busy := answer{rec: Record{ID: id, State: StateInProgress}, err: &RetryError{Err: ErrInProgress, RetryAfter: e.cfg.retryAfter}, decision: DecisionRejectedBusy}
	for {
		rec, err := e.store.Get(ctx, id, e.cfg.clock())
		switch {
		case errors.Is(err, ErrNotFound):
			// The winner's commit has not reached this node yet (or it
			// was rolled back too).
		case err != nil:
			return answer{err: storeErr(err), decision: DecisionStoreError}
		case len(fp) > 0 && len(rec.Fingerprint) > 0 && !bytes.Equal(fp, rec.Fingerprint):
			return answer{rec: rec, err: ErrMismatch, decision: DecisionMismatch}
		case rec.State == StateCompleted:
			return rt.replay(ctx, rec)
		case rec.State == StateIndeterminate:
			a := rt.replay(ctx, rec)
			if a.err == nil {
				a.decision = DecisionIndeterminate
			}
			return a
		default:
			busy.rec = rec
		}
		now := e.cfg.clock()
		if rt.p.wait <= 0 || !now.Before(deadline) {
			return busy
		}
		t := time.NewTimer(min(backoff, deadline.Sub(now)))
		backoff = min(2*backoff, 100*time.Millisecond)
		select {
		case <-wait.Done():
			t.Stop()
			return busy
		case <-t.C:
		}
	}
}

// abort gives up an attempt whose handler never ran (the claim is undone).
func (a *attempt) abort() {
	a.e.unhold(a)
	a.localTx(true)
	if a.tx != nil {
		_ = a.tx.Rollback()
		return
	}
	_ = a.e.store.Release(a.storeCtx(), a.id, a.token)
}

// completionExpiry is the ExpiresAt the attempt's completion records: in
// atomic mode the claim's (the claim and the completion are one
// transaction, and an unchanged expires_at keeps the completion an
// in-place update on Postgres), in leased mode the retention from now.
// A claim whose retention passed while its handler ran (a retention
// shorter than the attempt) gets the retention from now, as in leased
// mode, rather than a record that is absent the moment it commits.
func (a *attempt) completionExpiry() time.Time {
	now := a.e.cfg.clock()
	if a.rt.atomic && a.expires.After(now) {
		return a.expires
	}
	return now.Add(a.rt.p.retention)
}

// storeCtx is the context for recording the outcome: the attempt's, unless
// it was cancelled (the client went away), because the outcome must still
// be recorded.
func (a *attempt) storeCtx() context.Context {
	if a.ctx.Err() != nil {
		return context.WithoutCancel(a.ctx)
	}
	return a.ctx
}

// --- what handlers can say -------------------------------------------------

type attemptKey struct{}

func attemptFrom(ctx context.Context) *attempt {
	// A superseded call's attempt was given up (a nested layer took the
	// request over): it protects nothing any more.
	if c, ok := ctx.Value(attemptKey{}).(*call); ok && c.claimed && c.phase.Load() != phaseSuperseded {
		return &c.att
	}
	return nil
}

// noAttempt is the error of MarkEffect, Release and DownstreamKey called
// with a context that carries no protected request.
func noAttempt(call string) error {
	return fmt.Errorf("%w: %s needs the request's context: c.Request.Context() (Gin), c.Request().Context() (Echo), r.Context() (net/http, chi), "+
		"or ginidem.DownstreamKey(c, step) / echoidem.DownstreamKey(c, step); a request that passed through unprotected (method not covered, KeyOptional without a key, fail-open) has none",
		ErrNoAttempt, call)
}

// MarkEffect tells the engine that the handler is about to cause an effect
// outside the store's transaction (a payment, an email, a call to another
// service). From then on nothing releases the record: a 5xx, a 408, a 429
// or a panic leaves it indeterminate, any other answer is recorded, and a
// transaction that does not commit is settled as indeterminate, so a retry
// does not blindly run again. Call it right before the external call: a
// 5xx before it releases the key (in either mode: nothing happened yet).
// It returns an error wrapping ErrNoAttempt, and the effect is not
// covered, outside a protected request (usually: a framework's context
// was passed instead of the request's) and once the attempt was settled
// (the handler answered already, or runs on after its timeout): do not
// start the effect then.
func MarkEffect(ctx context.Context) error {
	a := attemptFrom(ctx)
	if a == nil {
		return noAttempt("core.MarkEffect")
	}
	if !a.markEffect() {
		return fmt.Errorf("%w: core.MarkEffect: the attempt was already settled (the handler answered, or ran on after its timeout): no live attempt holds the record, so the effect would not be covered; do not start it", ErrNoAttempt)
	}
	return nil
}

// Release tells the engine that nothing happened (for example validation
// failed before any effect): whatever the handler answers, the record is
// released and, in atomic mode, the transaction rolled back, so a corrected
// request may use the same key. After MarkEffect something may have
// happened, so the record is never released: Release then changes nothing
// and returns an error wrapping ErrConfig. Outside a protected request it
// does nothing and returns an error wrapping ErrNoAttempt.
func Release(ctx context.Context) error {
	a := attemptFrom(ctx)
	if a == nil {
		return noAttempt("core.Release")
	}
	if m := a.mark.Load(); m == markSettled || m == markSettledEffect {
		return fmt.Errorf("%w: core.Release: the attempt was already settled (the handler answered, or ran on after its timeout): it changes nothing", ErrNoAttempt)
	}
	if a.effect() {
		return fmt.Errorf("%w: core.Release after core.MarkEffect: the effect may have happened, so the record is kept (recorded, or indeterminate for a 5xx); release only before the external call", ErrConfig)
	}
	a.release.Store(true)
	return nil
}

// DownstreamKey returns a deterministic idempotency key for step (such as
// "charge") of the protected request in ctx, to pass to an external API:
// the same for every attempt of the same (caller, scope, key), so a takeover
// repeats the external call safely. It never returns an empty key: outside
// a protected request (a framework's context passed instead of the
// request's, or a request that passed through unprotected) it returns an
// error wrapping ErrNoAttempt that names the right call. Gin and Echo
// handlers can use ginidem.DownstreamKey and echoidem.DownstreamKey.
func DownstreamKey(ctx context.Context, step string) (string, error) {
	a := attemptFrom(ctx)
	if a == nil {
		return "", noAttempt("core.DownstreamKey")
	}
	if step == "" {
		return "", fmt.Errorf("%w: core.DownstreamKey: empty step name (name the external call, such as \"charge\")", ErrConfig)
	}
	return DownstreamKeyFor(a.id, step), nil
}

// DownstreamKeyFor is DownstreamKey for a record ID (for resolvers).
func DownstreamKeyFor(id ID, step string) string {
	return Identity{Caller: id.String(), Scope: "idem/downstream", Key: step}.ID().String()
}

// AttemptInfo describes the protected request a handler runs in.
type AttemptInfo struct {
	Identity Identity
	ID       ID
	Attempt  int  // 1, or more after takeovers
	Atomic   bool // atomic mode: the handler's writes commit with the record
}

// AttemptFrom returns information about the protected request in ctx.
func AttemptFrom(ctx context.Context) (AttemptInfo, bool) {
	a := attemptFrom(ctx)
	if a == nil {
		return AttemptInfo{}, false
	}
	return AttemptInfo{Identity: a.ident, ID: a.id, Attempt: a.number, Atomic: a.rt.atomic}, true
}
