package core

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemkit/idem/core/observe"
	"github.com/idemkit/idem/core/store"
)

// Completer settles, without a client, the records of named routes
// (Name) that are indeterminate or whose lease lapsed: it asks the
// route's resolver (WithResolver) and records its answer, releases the
// record when nothing happened, or runs the recorded request again
// (Finish). Run one on every replica: the store's marks make each visit
// of a record one completer's (Settler.Visit), and every write is fenced
// by the record's token, so a client retrying at the same moment, another
// replica or an operator settle a record once between them. A record
// that is not settled after MaxTries visits is left for the operator,
// with a WARN that names it. Engine.Completer makes one (docs/contract.md,
// section 4 "Recovery without a client").
type Completer struct {
	// Every is the pause between passes (default DefaultCompleteEvery).
	Every time.Duration
	// Batch is the most records one pass looks at (default
	// DefaultCompleteBatch, at most MaxListLimit).
	Batch int
	// MaxTries is how many visits a record gets before it is left for
	// the operator (default DefaultMaxTries).
	MaxTries int
	// Backoff is the wait after a record's first visit that did not
	// settle it, doubled at every further visit up to MaxBackoff
	// (defaults DefaultBackoff, DefaultMaxBackoff).
	Backoff, MaxBackoff time.Duration
	// Parallel is how many records of a pass are visited at once
	// (default 1: one after another). A visit that runs a finisher
	// (Finish) lasts as long as the route's work; with Parallel above 1
	// up to Parallel of them run side by side, each an attempt of its own
	// holding what an attempt holds (a store connection, in atomic mode
	// for as long as it runs).
	Parallel int

	e      *Engine
	mu     sync.Mutex
	cancel context.CancelFunc
	done   chan struct{}
	// multi is what the store said of its database (MultiPrimary):
	// unasked (0), single-primary (1) or multi-primary (2).
	multi atomic.Int32
}

// CompleteResult counts what one pass of a Completer did.
type CompleteResult struct {
	Settled  int // the resolver's applied answer was recorded
	Released int // the resolver said not applied: released
	Finished int // the recorded request ran again (Finish)
	Left     int // the ceiling: left for the operator
	Failed   int // the resolver or the store failed (retried later)
	// Visited counts the records this completer visited (another
	// replica's visits and live attempts are not counted).
	Visited int
}

// add adds what o counted to r.
func (r *CompleteResult) add(o CompleteResult) {
	r.Settled += o.Settled
	r.Released += o.Released
	r.Finished += o.Finished
	r.Left += o.Left
	r.Failed += o.Failed
	r.Visited += o.Visited
}

// Completer returns a completer over the engine's store and named
// routes. Set its fields before Start. Its records are the marks of the
// store, which must implement Settler (memstore, sqlstore, gormstore and
// pgxstore do).
func (e *Engine) Completer() *Completer { return &Completer{e: e} }

// Check reports whether the completer can run: the store keeps marks
// (Settler), at least one route is named (Name), and every named route
// has a resolver. Start calls it; call it once the routes are built.
// Its error wraps ErrConfig and names the fix.
func (c *Completer) Check() error {
	if c.e == nil {
		return fmt.Errorf("%w: a core.Completer must be made with Engine.Completer (e.Completer())", ErrConfig)
	}
	e := c.e
	if e.settler == nil {
		return fmt.Errorf("%w: the store (%T) keeps no marks (store.Settler), so the completer cannot find records to settle", ErrConfig, e.store)
	}
	e.routesMu.Lock()
	defer e.routesMu.Unlock()
	if len(e.routes) == 0 {
		return fmt.Errorf("%w: no route is named (core.Name): the completer settles only the records of named routes; name the routes whose resolver can settle records, and start the completer after building them", ErrConfig)
	}
	names := make([]string, 0, len(e.routes))
	for name := range e.routes {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		if rt := e.routes[name]; rt.p.resolver == nil || *rt.p.resolver == nil {
			return fmt.Errorf("%w: route %q is named for the completer but has no resolver (core.WithResolver): its records could only be left for the operator", ErrConfig, name)
		}
	}
	if c.Batch > store.MaxListLimit {
		return fmt.Errorf("%w: Completer.Batch %d is over %d", ErrConfig, c.Batch, store.MaxListLimit)
	}
	return nil
}

// checkCluster refuses to run a finisher (Finish) on an atomic route
// when the store's database is a multi-primary cluster (MultiPrimary):
// there a finisher on one node and a client's retry on another would
// both claim the record before either commits, and both run (a second
// charge). It asks the store once, when a route needs it.
func (c *Completer) checkCluster(ctx context.Context) error {
	mp, ok := c.e.store.(store.MultiPrimary)
	if !ok {
		return nil
	}
	var names []string
	c.e.routesMu.Lock()
	for name, rt := range c.e.routes {
		if rt.atomic && rt.p.finish != nil {
			names = append(names, name)
		}
	}
	c.e.routesMu.Unlock()
	if len(names) == 0 {
		return nil
	}
	if c.multi.Load() == 0 {
		multi, err := mp.MultiPrimary(c.e.adminCtx(ctx))
		if err != nil {
			return storeErr(err)
		}
		v := int32(1)
		if multi {
			v = 2
		}
		c.multi.Store(v)
	}
	if c.multi.Load() == 1 {
		return nil
	}
	sort.Strings(names)
	return fmt.Errorf("%w: route %q runs the recorded request again (core.Finish) in atomic mode, but the store (%T) is on a multi-primary cluster (such as MariaDB Galera), "+
		"where a claim on one node is seen on another only when it commits, so a finisher and a client's retry on two nodes could both run it (a second charge): "+
		"make the route core.Leased, or send every write through one node and tell the store so (sqlstore.WithOneWriterNode)", ErrConfig, names[0], c.e.store)
}

// Start checks the completer (Check, and, when an atomic route has a
// finisher, whether the store is on a multi-primary cluster:
// MultiPrimary), then runs a pass now and then every c.Every until Stop
// or ctx ends. Calling Start on a running completer is a no-op.
func (c *Completer) Start(ctx context.Context) error {
	if err := c.Check(); err != nil {
		return err
	}
	if err := c.checkCluster(ctx); err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cancel != nil {
		return nil
	}
	ctx, c.cancel = context.WithCancel(ctx)
	done := make(chan struct{})
	c.done = done
	every := c.Every
	if every <= 0 {
		every = DefaultCompleteEvery
	}
	go func() {
		defer close(done)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			if _, err := c.Complete(ctx); err != nil && !errors.Is(err, context.Canceled) {
				c.e.cfg.logger.Error("idempotency completer: a pass failed", slog.String("error", err.Error()))
			}
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	return nil
}

// Stop stops a started completer and waits for a running pass (and its
// finishers) to end. It may be called at any time.
func (c *Completer) Stop() {
	c.mu.Lock()
	cancel, done := c.cancel, c.done
	c.cancel, c.done = nil, nil
	c.mu.Unlock()
	if cancel != nil {
		cancel()
		<-done
	}
}

// Complete runs one pass: it reads at most Batch due marks (Settler.Due)
// and visits each. It returns what it did, and an error only when the
// store could not be read (each record's failure is counted in Failed,
// logged and reported to the Observer), or when it must not run: an
// atomic route's finisher on a multi-primary cluster (see Start), an
// error wrapping ErrConfig, before any record is visited.
func (c *Completer) Complete(ctx context.Context) (CompleteResult, error) {
	var res CompleteResult
	if c.e == nil || c.e.settler == nil {
		return res, c.Check()
	}
	if err := c.checkCluster(ctx); err != nil {
		return res, err
	}
	e := c.e
	batch := c.Batch
	if batch <= 0 {
		batch = DefaultCompleteBatch
	}
	due, err := e.settler.Due(e.adminCtx(ctx), e.cfg.clock(), batch)
	if err != nil {
		return res, storeErr(err)
	}
	if c.Parallel > 1 && len(due) > 1 {
		return c.visitParallel(ctx, due)
	}
	for _, p := range due {
		if ctx.Err() != nil {
			return res, ctx.Err()
		}
		c.visit(ctx, p, &res)
	}
	return res, nil
}

// visitParallel visits due with at most c.Parallel visits at once; a
// visit begun completes, and no visit begins once ctx ends.
func (c *Completer) visitParallel(ctx context.Context, due []store.Pending) (CompleteResult, error) {
	var (
		res  CompleteResult
		mu   sync.Mutex
		wg   sync.WaitGroup
		next = make(chan store.Pending)
	)
	for range min(c.Parallel, len(due)) {
		wg.Go(func() {
			for p := range next {
				var r CompleteResult
				c.visit(ctx, p, &r)
				mu.Lock()
				res.add(r)
				mu.Unlock()
			}
		})
	}
feed:
	for _, p := range due {
		if ctx.Err() != nil {
			break
		}
		select {
		case next <- p:
		case <-ctx.Done():
			break feed
		}
	}
	close(next)
	wg.Wait()
	return res, ctx.Err()
}

// backoff is the wait after the tries-th visit.
func (c *Completer) backoff(tries int) time.Duration {
	d, limit := c.Backoff, c.MaxBackoff
	if d <= 0 {
		d = DefaultBackoff
	}
	if limit <= 0 {
		limit = DefaultMaxBackoff
	}
	for i := 1; i < tries && d < limit; i++ {
		d *= 2
	}
	return min(d, limit)
}

// visit settles one due record, if this completer wins its visit.
func (c *Completer) visit(ctx context.Context, p store.Pending, res *CompleteResult) {
	e := c.e
	sctx := e.adminCtx(context.WithoutCancel(ctx)) // a visit once begun completes
	rec, m := p.Record, p.Mark
	now := e.cfg.clock()
	rt := e.namedRoute(m.Route)
	start := now
	ev := observe.Event{ID: rec.ID, Caller: rec.Caller, Scope: rec.Scope, Key: rec.Key, Route: m.Route, Attempt: rec.Attempt}
	if rec.State == store.StateInProgress {
		// A live attempt records its own outcome: look again when its
		// lease lapses (atomic mode: when no attempt can still hold it).
		var next time.Time
		switch {
		case !rec.LeaseUntil.IsZero() && rec.LeaseUntil.After(now):
			next = rec.LeaseUntil
		case rec.LeaseUntil.IsZero() && (rt == nil || !rt.abandonedClaim(rec, now)):
			next = now.Add(e.cfg.lease)
			if rt != nil && rt.p.maxAttempt > 0 {
				next = rec.CreatedAt.Add(rt.p.maxAttempt)
			}
		}
		if !next.IsZero() {
			if !next.After(m.After) {
				next = m.After.Add(time.Second)
			}
			if _, err := e.settler.Visit(sctx, rec.ID, rec.Token, m.After, next, m.Tries); err != nil {
				res.Failed++
				ev.Decision, ev.Err = observe.DecisionSettleError, storeErr(err)
				e.emit(ctx, ev, start)
			}
			return
		}
	}
	maxTries := c.MaxTries
	if maxTries <= 0 {
		maxTries = DefaultMaxTries
	}
	if m.Tries >= maxTries {
		// The ceiling: the mark waits for the record's expiry (and goes
		// with it); the operator settles the record.
		next := rec.ExpiresAt
		if !next.After(m.After) {
			next = m.After.Add(time.Second)
		}
		won, err := e.settler.Visit(sctx, rec.ID, rec.Token, m.After, next, m.Tries)
		if err != nil || !won {
			return
		}
		res.Visited++
		res.Left++
		ev.Decision = observe.DecisionLeft
		ev.Err = fmt.Errorf("idem: record %s (route %q, %s) was not settled after %d visits: it is left for the operator (idemctl show, resolve, release)", rec.ID, m.Route, rec.State, m.Tries)
		e.emit(ctx, ev, start)
		return
	}
	tries := m.Tries + 1
	next := now.Add(c.backoff(tries))
	won, err := e.settler.Visit(sctx, rec.ID, rec.Token, m.After, next, tries)
	if err != nil {
		res.Failed++
		ev.Decision, ev.Err = observe.DecisionSettleError, storeErr(err)
		e.emit(ctx, ev, start)
		return
	}
	if !won {
		return // another completer visits it
	}
	res.Visited++
	fail := func(err error) {
		res.Failed++
		ev.Decision, ev.Err = observe.DecisionSettleError, err
		e.emit(ctx, ev, start)
	}
	if rt == nil {
		fail(fmt.Errorf("%w: no route of this process is named %q (core.Name), so record %s cannot be settled here (visit %d of %d)", ErrConfig, m.Route, rec.ID, tries, maxTries))
		return
	}
	if rt.atomic && rt.p.finish != nil {
		// The pass checked the routes it began with; this one may have
		// been registered since (Once registers its route at its first
		// call). Asked once, like the pass's check.
		if err := c.checkCluster(ctx); err != nil {
			fail(err)
			return
		}
	}
	var req *RecordedRequest
	if len(m.Request) > 0 {
		if req, err = e.openRequest(rec.ID, m.Request); err != nil {
			fail(err)
			return
		}
	}
	rctx := sctx
	if rt.atomic || e.tx == nil {
		rctx = context.WithoutCancel(ctx) // atomic: the resolver's transaction is the store's own
	}
	outcome, err := rt.applyResolver(rctx, rec, req)
	switch {
	case errors.Is(err, ErrFenced):
		// Another settler (a client's retry, a replica, an operator)
		// changed the record first: nothing to do.
		e.cfg.logger.DebugContext(ctx, "idempotency completer: the record was settled by another", slog.String("id", rec.ID.String()))
		return
	case err != nil:
		fail(err)
		return
	}
	switch outcome {
	case OutcomeApplied:
		res.Settled++
		ev.Decision = observe.DecisionSettled
		if got, err := e.store.Get(sctx, rec.ID, e.cfg.clock()); err == nil {
			ev.Status = got.Status
		}
		e.emit(ctx, ev, start)
	case OutcomeNotApplied:
		if rt.p.finish != nil && req != nil {
			c.finish(ctx, rt, rec, req, m, tries, res)
			return
		}
		res.Released++
		ev.Decision = observe.DecisionSettleReleased
		e.emit(ctx, ev, start)
	default:
		e.cfg.logger.DebugContext(ctx, "idempotency completer: the resolver could not tell yet", slog.String("id", rec.ID.String()),
			slog.Int("tries", tries), slog.Time("next", next))
	}
}

// finish runs the recorded request of rec again (Finish), once its
// resolver said nothing happened and the record was released: it claims
// the record as an attempt of its own (with rec's fingerprint and the
// mark's request and tries, so the ceiling still counts) and runs the
// route's Finish function as Exec runs a function. A client that claimed the
// record first wins: nothing runs.
func (c *Completer) finish(ctx context.Context, rt *Route, rec store.Record, req *RecordedRequest, m store.Mark, tries int, res *CompleteResult) {
	e := c.e
	start := e.cfg.clock()
	ev := observe.Event{ID: rec.ID, Caller: rec.Caller, Scope: rec.Scope, Key: rec.Key, Route: m.Route}
	ident := store.Identity{Caller: req.Caller, Scope: rec.Scope, Key: rec.Key}
	f := &finishCall{fn: *rt.p.finish, req: req}
	cl := &f.call
	cl.route, cl.start, cl.ev, cl.ident, cl.fingerprint = rt, start, ev, ident, rec.Fingerprint
	cl.markRequest, cl.markTries, cl.request = m.Request, tries, req
	cl.ctx = context.WithValue(e.adminCtx(context.WithoutCancel(ctx)), attemptKey{}, cl)
	defer func() {
		// A panic of the finisher was recorded (released, or
		// indeterminate after MarkEffect) and reported: the completer
		// goes on with the next record.
		if v := recover(); v != nil {
			res.Failed++
			e.cfg.logger.ErrorContext(ctx, "idempotency completer: the finisher panicked", slog.String("id", rec.ID.String()), slog.Any("panic", v))
		}
	}()
	got := rt.enter(&job{c: cl, ctx: cl.ctx, allow: e.cfg.recorded}, transport{handle: f.handle, panicked: f.panicked})
	ev = cl.ev
	if !got.ran {
		// A client's retry claimed it first (or the store failed): that
		// attempt records the outcome.
		if got.ans.err != nil && !errors.Is(got.ans.err, ErrInProgress) {
			res.Failed++
			ev.Decision, ev.Err = observe.DecisionSettleError, got.ans.err
			e.emit(ctx, ev, start)
		}
		return
	}
	ev.Status = f.resp.Status
	if got.err != nil {
		res.Failed++
		ev.Decision, ev.Err = observe.DecisionSettleError, got.err
	} else {
		res.Finished++
		ev.Decision = observe.DecisionFinished
	}
	e.emit(ctx, ev, start)
}

// finishCall is the finisher's transport for the machine's entry: the
// recorded request runs again through the route's Finish function.
type finishCall struct {
	call
	fn   func(ctx context.Context, req RecordedRequest) *Response
	req  *RecordedRequest
	resp *Response
}

func (f *finishCall) handle(ctx context.Context) (*Response, bool, error) {
	if f.resp = f.fn(context.WithValue(ctx, resolvingKey{}, f.req), *f.req); f.resp == nil {
		f.resp = &Response{Status: 500}
	}
	return capped(f.resp, f.route.e.cfg.maxResponse), false, nil
}

func (f *finishCall) panicked(any) *Response { return &Response{Status: 500, BodyKept: true} }
