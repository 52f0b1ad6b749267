package core

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/idemkit/idem/core/store"
)

// Engine is the idempotency state machine over a Store. It is safe for
// concurrent use; create one per store and share it between routes.
type Engine struct {
	store  store.Store
	tx     store.TxStore // store as a TxStore; nil when the store has no transactions
	cfg    config
	def    *Route
	leases leases
	// settler is store as a Settler; nil when the store keeps no marks.
	settler store.Settler
	// guards: MarkEffect of an atomic attempt commits an effect guard
	// (store.ID.EffectGuard) before the effect; false for a store whose
	// database runs in the process (store.Embedded) and without a TxStore.
	guards bool
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
func New(st store.Store, opts ...Option) (*Engine, error) {
	if st == nil {
		return nil, fmt.Errorf("%w: nil store", ErrConfig)
	}
	e := &Engine{store: st}
	e.tx, _ = st.(store.TxStore)
	e.settler, _ = st.(store.Settler)
	e.guards = e.tx != nil
	if em, ok := st.(store.Embedded); ok && em.Embedded() {
		e.guards = false
	}
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

// Store returns the engine's store, for code that is handed an engine and
// needs its store: a test suite (scenario.StoreTx), a tool.
func (e *Engine) Store() store.Store { return e.store }

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
// (store.ID.DownstreamKey). It is called for a duplicate that meets the record,
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
type Resolver func(ctx context.Context, rec store.Record) (Resolution, error)

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
//
// In atomic mode on a database server (not SQLite) MarkEffect first
// commits an effect guard on a connection of its own (one statement): the
// attempt's claim lives in its transaction, and a transaction can end
// without the engine (a session the database killed, a COMMIT lost while
// the database is out of reach), taking the claim with it. A later
// attempt of the same request then meets the guard in its own MarkEffect,
// which fails with an error wrapping ErrIndeterminate: its writes are
// rolled back and the record becomes indeterminate (500 outcome-unknown),
// so the effect never runs twice. An operator's or a resolver's release
// removes the guard with the record.
//
// It returns an error, and the effect must not be started, when: the
// context carries no protected request (ErrNoAttempt; usually a
// framework's context was passed instead of the request's); the attempt
// was settled already (ErrNoAttempt: the handler answered, or runs on
// after its timeout); the guard could not be written (ErrStoreUnavailable;
// the record is not released for it); an earlier attempt's guard is there
// (ErrIndeterminate).
func MarkEffect(ctx context.Context) error {
	a := attemptFrom(ctx)
	if a == nil {
		return noAttempt("core.MarkEffect")
	}
	if !a.markEffect() {
		return fmt.Errorf("%w: core.MarkEffect: the attempt was already settled (the handler answered, or ran on after its timeout): no live attempt holds the record, so the effect would not be covered; do not start it", ErrNoAttempt)
	}
	return a.guardEffect(ctx)
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
// handlers can use ginidem.DownstreamKey and echoidem.DownstreamKey; a
// resolver, which has the record, asks for rec.ID.DownstreamKey(step).
func DownstreamKey(ctx context.Context, step string) (string, error) {
	a := attemptFrom(ctx)
	if a == nil {
		return "", noAttempt("core.DownstreamKey")
	}
	if step == "" {
		return "", fmt.Errorf("%w: core.DownstreamKey: empty step name (name the external call, such as \"charge\")", ErrConfig)
	}
	return a.id.DownstreamKey(step), nil
}

// AttemptInfo describes the protected request a handler runs in.
type AttemptInfo struct {
	Identity store.Identity
	ID       store.ID
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
