package core

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemkit/idem/core/observe"
	"github.com/idemkit/idem/core/store"
	"github.com/idemkit/idem/internal/debugtext"
)

// This file is the state machine of doc.go's table, all of it: one entry
// and one exit for every driver (step: enter, exit), the claim and its
// decisions (acquire, resolve), how a handler's end is classified and
// recorded (classify, finish, record), and what follows a transaction
// that ended other than by the engine's commit (afterLostRace, afterEnd,
// afterAbort, afterLocalEnd).

// --- the state machine -----------------------------------------------------

// attempt is one execution that owns a record.
type attempt struct {
	e      *Engine
	rt     *Route
	ident  store.Identity
	id     store.ID
	token  int64
	number int
	start  time.Time
	ctx    context.Context // carries the transaction in atomic mode
	tx     store.Tx        // middleware-managed atomic mode: ours to commit
	joined bool            // caller-managed atomic mode: the caller's transaction
	owned  bool            // Route.Within: the service's transaction, ended when the engine settles after it
	// ltx is a leased attempt's transaction for the handler's local
	// writes, lctx the context carrying it (withLocalTx).
	ltx  store.Tx
	lctx context.Context
	// localUsed: the handler's local writes began in ltx, so the handler's
	// answer is true only once they committed (see Route.exit).
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

	// The effect guard (guardEffect): written once, by the first
	// MarkEffect; guardErr is what every MarkEffect then returns.
	// refused: an earlier attempt's guard was there, so this attempt's
	// outcome is indeterminate whatever the handler answers.
	guardMu   sync.Mutex
	guardDone bool
	guardErr  error
	refused   atomic.Bool
	// vanished: the completion found the claim gone from the attempt's
	// own open transaction (record): the handler's later statements may
	// have committed in autocommit, so the attempt counts as an effect.
	vanished bool

	// leased mode: the engine's heartbeat extends the lease while the
	// attempt is held (see lease.go) and cancels the handler's context with
	// ErrLeaseLost when a takeover fenced it.
	lost atomic.Bool
	// stop releases the MaxAttempt timer of a middleware-managed atomic
	// attempt (a no-op otherwise), timer is a leased attempt's (bound);
	// expired: MaxAttempt passed, the lease is no longer extended.
	stop    func()
	timer   *time.Timer
	expired atomic.Bool
	cancel  context.CancelCauseFunc

	// finish ran (atomic mode: at the response cap, before the handler
	// returned): later calls return its result.
	finished bool
	verdict  verdict // how the handler ended (set by finish)
	decision observe.Decision
	err      error
	complete time.Duration // how long finish took (Event.Complete)
}

// answer is the engine's decision for a request that did not get to run:
// either a recorded response to replay or an error to reject with.
type answer struct {
	rec      store.Record
	resp     recorded // the response to replay
	err      error
	decision observe.Decision
	// unreachable: the store could not be asked (Begin or Claim failed),
	// the only StoreError that fail-open may run the handler for. A
	// record that was read but cannot be opened or settled is not one:
	// running the handler again could repeat its effect.
	unreachable bool
	// claim is how long acquire took (Event.Claim), set for a claimed
	// attempt too.
	claim time.Duration
}

// --- one request through the machine --------------------------------------
//
// Every driver (Route.Serve, Route.Within, Route.Exec, Engine.Once, the
// Completer's finisher) reads its transport into a job and hands it to
// step: enter claims the record (acquire) or decides without running, and
// runs the handler (its context, the heartbeat, the bound, recover) to its
// end (classify, finish); exit turns what happened into the answer (a lost
// race and an aborted transaction included), has the driver write it
// (reply) and emits the event. Route.Within runs enter inside the
// service's transaction and exit after it.

// job is one request as a driver hands it to the machine: the call (its
// identity, fingerprint, event and start) and the context of the claim.
type job struct {
	c   *call
	ctx context.Context // the claim's: carries c (c.ctx, or Within's transaction)
	// failOpen: the driver can run the handler unprotected when the store
	// is unreachable (WithFailOpen, leased mode).
	failOpen bool
	// keepCancel: in leased mode the handler's context ends with the
	// request's (Once); otherwise the attempt outlives its client.
	keepCancel bool
	// owned: the service's own transaction (Route.Within), which has ended
	// by the time exit runs.
	owned bool
	// allow filters the headers recorded of the handler's answer: the
	// allowlist for a captured response, nil to record Response.Header as
	// given.
	allow []string
}

// transport is what a driver does for the machine: run the handler and
// write the answer. Its functions are only called, never kept, so that a
// driver's closures stay on its stack.
type transport struct {
	// handle runs the handler with ctx and returns its answer; sent
	// reports that the answer reached the client already (streamed),
	// spill that it could not be kept whole: the attempt then ends as a
	// panic would.
	handle func(ctx context.Context) (resp *Response, sent bool, spill error)
	// panicked is the answer recorded for a handler that panicked with v.
	panicked func(v any) *Response
	// reply writes res and returns the status sent (0: none).
	reply func(res result) int
}

// result is the machine's answer to a job, for the transport's reply:
// run the handler unprotected (open), replay the recorded response
// ans.resp, reject with an error's problem document, or else deliver the
// handler's answer. It is passed by value: nothing of it lives on the
// heap for the reply's sake.
type result struct {
	open   bool
	replay bool
	reject error
	// ran: the handler ran, resp is its answer and err the end's error
	// (the outcome could not be made durable); void is that error when a
	// lost race voided the answer.
	ran     bool
	resp    *Response
	sent    bool
	err     error
	void    error
	spilled bool
	nested  bool   // a nested layer protected the request: nothing to answer
	txErr   error  // Route.Within: how the service's transaction ended
	ans     answer // the decision for a request that did not run
}

// discarded settles the attempt of a result whose answer the driver
// discards: a TxFunc ran the handler in a first body call and then called
// body again (a retry after a failed commit). That transaction ended as
// the TxFunc chose, so the attempt is settled from the record as after
// any failed commit (afterEnd: after MarkEffect recorded indeterminate),
// or the client's retry would repeat its effect.
func (c *call) discarded(res result) {
	if !res.ran || res.nested {
		return
	}
	resp := res.resp
	if resp == nil {
		resp = &Response{Status: 500}
	}
	_, _ = c.att.afterEnd(c.att.verdict, resp, c.ev.Err)
}

// step takes j through the machine with the driver's transport t:
// enter, then exit.
func (rt *Route) step(j *job, t transport) {
	res := rt.enter(j, t)
	rt.exit(j, &res, t)
}

// enter claims j's record, or decides without running (res.ans), and runs
// the handler to its end.
func (rt *Route) enter(j *job, t transport) (res result) {
	e, c := rt.e, j.c
	ev := &c.ev
	c.detached = detached{j.ctx}
	att, ans := rt.acquire(j.ctx, c)
	ev.Claim = ans.claim
	if att == nil {
		ev.Decision, ev.Err, ev.Attempt = ans.decision, ans.err, ans.rec.Attempt
		res.ans = ans
		return res
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
		base := j.ctx
		if !j.keepCancel {
			base = &c.detached
		}
		var cancel context.CancelCauseFunc
		hctx, cancel = context.WithCancelCause(base)
		defer cancel(nil)
		att.cancel = cancel
		hctx = att.withLocalTx(hctx)
	}
	att.bound()
	defer att.unbound()
	e.hold(att)
	res.ran = true
	var spill error
	panicked := true
	func() {
		defer func() {
			if !panicked || !c.settles() {
				return
			}
			// The handler panicked: its attempt ends as a panic's, with
			// the transport's answer for it recorded; the panic goes on.
			v := recover()
			att.end(ev, t.panicked(v), true)
			e.emit(c.ctx, *ev, c.start)
			panic(v)
		}()
		res.resp, res.sent, spill = t.handle(hctx)
		panicked = false
	}()
	if !c.settles() {
		res.nested = true // the nested layer settled its own attempt
		return res
	}
	if spill != nil {
		// The answer could not be kept whole (atomic mode, the answer past
		// the cap could not be spilled to its temporary file): nothing of
		// it is recorded; the attempt ends as a panic would (released:
		// the transaction rolls back; indeterminate after MarkEffect) and
		// the client gets the engine's 500.
		e.cfg.logger.ErrorContext(c.ctx, "idempotency: the answer past the recording cap could not be spilled to its temporary file; the attempt ends as a panic would and the client gets 500",
			slog.String("id", ev.ID.String()), slog.String("error", spill.Error()))
		res.spilled = true
		res.err = errors.Join(spill, att.end(ev, t.panicked(spill), true))
		ev.Err = res.err
		return res
	}
	att.recordAllow = j.allow // the engine's own answers (a panic's) are recorded whole
	res.err = att.end(ev, res.resp, false)
	return res
}

// exit decides the answer to j from res, has the driver write it, and
// emits the event. It is where a lost race and a transaction that ended
// other than by the engine's commit are answered, for every driver.
func (rt *Route) exit(j *job, res *result, t transport) {
	e, c := rt.e, j.c
	ev, att := &c.ev, &c.att
	switch {
	case res.nested:
		e.cfg.logger.DebugContext(c.ctx, "idempotency: a nested layer protected the request", slog.String("scope", ev.Scope))
		return
	case !res.ran && res.ans.unreachable && j.failOpen && e.cfg.failOpen && !rt.atomic:
		ev.Err = fmt.Errorf("running WITHOUT idempotency protection (fail-open): %w", res.ans.err)
		e.emit(c.ctx, *ev, c.start)
		res.open = true
		t.reply(*res)
		return
	case !res.ran:
		if j.owned && errors.Is(res.ans.err, ErrLostRace) {
			// The claim lost to a concurrent transaction: the other
			// request holds the key; once it is visible, its answer.
			res.ans = rt.afterLostRace(c.ctx, ev.ID, c.fingerprint, c.start)
			ev.Decision, ev.Err, ev.Attempt = res.ans.decision, res.ans.err, res.ans.rec.Attempt
		}
		res.answer()
	case res.sent:
		// The answer reached the client already (streamed): it stands.
	case res.spilled:
		res.reject = res.err
	case rt.atomic && errors.Is(res.err, ErrLostRace) && (!att.joined || j.owned):
		// The database rolled the transaction back for a concurrent claim
		// of the identity (another Galera node's): the handler's answer
		// is void; answer as the duplicate this was. In the caller's
		// transaction, the caller rolls back: the error matches
		// ErrInProgress, ErrLostRace and ErrTxAborted.
		res.ans = rt.afterLostRace(c.ctx, ev.ID, c.fingerprint, c.start)
		ev.Decision, ev.Err = res.ans.decision, errors.Join(res.ans.err, res.err)
		res.void = res.err
		res.answer()
	case j.owned && (res.err != nil || (res.txErr != nil && ev.Decision != observe.DecisionReleased)):
		// Route.Within: the completion failed in the service's
		// transaction, or the transaction did not commit (or its outcome
		// is unknown): the record tells what is left (afterEnd).
		cause := res.err
		if cause == nil {
			cause = res.txErr
		}
		var err error
		ev.Decision, err = att.afterEnd(att.verdict, res.resp, cause)
		ev.Err, res.reject = errors.Join(cause, err), err
	case res.err != nil && (rt.atomic || att.localUsed || errors.Is(res.err, ErrLeaseLost) || errors.Is(res.err, ErrOutcomePending)):
		// Atomic mode, or leased with local writes: the outcome is not
		// durable (rolled back), so the handler's answer must not reach
		// the client. Lost lease: the new owner's answer is the one to
		// give. (Leased mode without local writes and without MarkEffect,
		// with a failing store: the handler's answer is delivered and the
		// failure logged; the record's lease will lapse.)
		res.reject = res.err
	}
	ev.Status = t.reply(*res)
	e.emit(c.ctx, *ev, c.start)
}

// answer sets the reply of a request that did not run (or whose answer a
// lost race voided) from res.ans: its replay, or its rejection.
func (res *result) answer() {
	if res.ans.err != nil {
		res.reject = res.ans.err
		return
	}
	res.replay = true
}

// claimRequest builds the store request for identity ident.
func (rt *Route) claimRequest(ident store.Identity, id store.ID, fp []byte, now time.Time) store.ClaimRequest {
	req := store.ClaimRequest{
		ID: id, Caller: debugtext.Clean(ident.Caller), Scope: debugtext.Clean(ident.Scope), Key: debugtext.Clean(ident.Key),
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
// A claimed attempt is written to c.att and returned.
//
// In leased mode every store call (the claim, the resolver's, and later
// the attempt's extensions and completion, through attempt.ctx) runs with
// the store's transaction hidden (TxStore.WithoutTx): the record commits on
// its own connection, whatever transaction the request's context carries
// (a transaction-per-request middleware's), so a rollback of that
// transaction cannot take the record with it (docs/contract.md, section 5 "Atomic and leased modes").
func (rt *Route) acquire(ctx context.Context, c *call) (att *attempt, ans answer) {
	e := rt.e
	ident, id, fp, start := c.ident, c.ev.ID, c.fingerprint, c.start
	began := e.cfg.clock()
	defer func() { ans.claim = e.cfg.clock().Sub(began) }()
	joined := rt.atomic && e.tx.InTx(ctx)
	sctx := rt.leasedCtx(ctx, &c.detached)
	deadline := start.Add(rt.p.wait)
	backoff := 5 * time.Millisecond
	// A lapsed lease is taken over only after the engine has compared the
	// fingerprints: the first claim never takes over; a second one does,
	// when the lapsed record's request matches this one.
	takeover := false
	// again counts a settle of rec (a takeover, a mark, a release by the
	// resolver), each followed by a claim again, and reports whether the
	// record under that token and in that state was settled maxSettles
	// times already: a store that leaves it as it was (the row locked,
	// the store failing, a release fenced by nobody) must not turn the
	// request into a loop against it. A record that changed state (in
	// progress, then marked indeterminate under the same token) is
	// settled afresh: the mark did its work.
	settles, settling, settlingState := 0, int64(0), store.State(0)
	again := func(rec store.Record) bool {
		if rec.Token != settling || rec.State != settlingState {
			settles, settling, settlingState = 0, rec.Token, rec.State
		}
		settles++
		return settles > maxSettles
	}
	for {
		now := e.cfg.clock()
		req := rt.claimRequest(ident, id, fp, now)
		req.Takeover, takeover = takeover, false
		if rt.p.name != "" && e.settler != nil {
			req.Mark = rt.mark(ctx, now) // written with the claim, atomically
		}
		cctx, tx, stop := sctx, store.Tx(nil), func() {}
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
				return nil, answer{err: storeErr(err), decision: observe.DecisionStoreError, unreachable: true}
			}
		}
		res, err := e.store.Claim(cctx, req)
		if err == nil && res.Claimed {
			c.att = attempt{e: e, rt: rt, ident: ident, id: id, token: req.Token, number: res.Record.Attempt,
				start: start, ctx: cctx, tx: tx, joined: joined, fp: fp, expires: req.ExpiresAt, stop: stop}
			return &c.att, answer{}
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
				return nil, answer{rec: store.Record{ID: id, State: store.StateInProgress}, err: &RetryError{Err: fmt.Errorf("%w: %w", ErrInProgress, err), RetryAfter: e.cfg.retryAfter}, decision: observe.DecisionRejectedBusy}
			}
			res, err = store.ClaimResult{Record: store.Record{ID: id, State: store.StateInProgress}}, nil
		}
		if err != nil && joined && errors.Is(err, ErrTxAborted) {
			return nil, answer{err: err, decision: observe.DecisionStoreError} // the caller's transaction is dead: only the caller can roll it back
		}
		if errors.Is(err, ErrConfig) {
			// The store refused the combination (for example a leased claim
			// beside a SQLite transaction it would wait for): a
			// configuration error, never a reason to fail open.
			return nil, answer{err: err, decision: observe.DecisionStoreError}
		}
		if err != nil {
			return nil, answer{err: storeErr(err), decision: observe.DecisionStoreError, unreachable: true}
		}
		rec := res.Record
		if len(fp) > 0 && len(rec.Fingerprint) > 0 && !bytes.Equal(fp, rec.Fingerprint) {
			return nil, answer{rec: rec, err: ErrMismatch, decision: observe.DecisionMismatch}
		}
		switch rec.State {
		case store.StateCompleted:
			return nil, rt.replay(sctx, rec)
		case store.StateIndeterminate:
			if again(rec) {
				e.cfg.logger.WarnContext(sctx, "idempotency: an indeterminate record stayed as it was after its release; answering from it", slog.String("id", id.String()))
				return nil, rt.indeterminate(sctx, rec)
			}
			a, retry := rt.resolve(sctx, rec)
			if !retry {
				return nil, a
			}
			continue // resolved as not applied: the record is gone, claim again
		}
		// In progress. A lapsed lease: the attempt died (or lost its
		// store) and may have had an effect. An abandoned claim: a
		// committed atomic claim that no attempt can still hold (a handler
		// committed the shared transaction itself and its process died
		// before the engine recorded the answer, or a caller committed its
		// transaction after Once failed); its writes are durable and may
		// include an effect. Either is settled, then claimed again: the
		// same request takes a lapsed lease over; otherwise the record
		// turns indeterminate (never run again blindly, never locked until
		// expiry) and is resolved.
		lapsed := !rec.LeaseUntil.IsZero() && !rec.LeaseUntil.After(now)
		canWait := rt.p.wait > 0 && now.Before(deadline) && !joined
		if lapsed || rt.abandonedClaim(rec, now) {
			switch {
			case !again(rec):
				if lapsed && e.cfg.takeover {
					takeover = true
				} else {
					rt.markIndeterminate(sctx, rec)
				}
				continue
			case !canWait:
				// The takeover was not honoured or the record could not be
				// marked (the store failed, or the row stayed locked):
				// busy, rather than claiming again without end.
				e.cfg.logger.WarnContext(sctx, "idempotency: a lapsed record could not be settled; answering in progress", slog.String("id", id.String()))
				return nil, answer{rec: rec, err: &RetryError{Err: ErrInProgress, RetryAfter: e.cfg.retryAfter}, decision: observe.DecisionRejectedBusy}
			}
			// WaitInFlight time is left: wait as for an attempt in flight
			// (a store blip passes), then settle the record once more.
			settles = maxSettles - 1
		}
		if !canWait {
			return nil, answer{rec: rec, err: &RetryError{Err: ErrInProgress, RetryAfter: e.busyRetryAfter(rec, now)}, decision: observe.DecisionRejectedBusy}
		}
		wait := min(backoff, deadline.Sub(now))
		backoff = min(2*backoff, 100*time.Millisecond)
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, answer{rec: rec, err: &RetryError{Err: ErrInProgress, RetryAfter: e.cfg.retryAfter}, decision: observe.DecisionRejectedBusy}
		case <-t.C:
		}
	}
}

// maxSettles bounds how often one request settles a record under one
// token (takes a lapsed lease over, marks it indeterminate, releases it
// for its resolver) and claims again.
const maxSettles = 3

// mark is the mark that a claim of the route made at now writes with its
// record (ClaimRequest.Mark): the route's name and the recorded request
// that ctx's call carries (a finisher's: also its tries). The completer
// first looks at the record a lease after the claim: most attempts have
// completed by then.
func (rt *Route) mark(ctx context.Context, now time.Time) *store.Mark {
	m := &store.Mark{Route: rt.p.name, After: now.Add(rt.e.cfg.lease)}
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
func (e *Engine) busyRetryAfter(rec store.Record, now time.Time) time.Duration {
	if left := rec.LeaseUntil.Sub(now); !rec.LeaseUntil.IsZero() && left < e.cfg.lease/2 {
		return left
	}
	return e.cfg.retryAfter
}

// leasedCtx is ctx for the route's store calls outside an atomic
// transaction. In leased mode it is d, ctx without its cancellation (the
// attempt outlives its client: its record must be written whatever
// happens to the request), with any transaction of the store that ctx
// carries hidden (see acquire).
func (rt *Route) leasedCtx(ctx context.Context, d *detached) context.Context {
	if rt.atomic {
		return ctx
	}
	if rt.e.tx != nil {
		return rt.e.tx.WithoutTx(d)
	}
	return d
}

// detached is context.WithoutCancel of its Context: the request's values
// without its cancellation, for an attempt that outlives its client (its
// store calls, the leased handler's context). The call holds it, so that
// it costs no allocation, and neither does a Value lookup through it
// (the context that context.WithoutCancel returns allocates on every
// Value call made on it directly, as a store's lookup of its transaction
// is, once per store call). Unlike context.WithoutCancel's,
// context.Cause of it is its parent's; the contexts derived from it that
// the engine hands out (the leased handler's) have their own cause.
type detached struct{ context.Context }

func (*detached) Deadline() (time.Time, bool) { return time.Time{}, false }
func (*detached) Done() <-chan struct{}       { return nil }
func (*detached) Err() error                  { return nil }

// bound starts the attempt's MaxAttempt bound; unbound ends it, once the
// attempt has finished. Atomic mode: the transaction's context carries
// the bound (Route.bounded); unbound releases its timer. Leased mode: at
// the bound the handler's context is cancelled (cause ErrAttemptTimeout)
// and the heartbeat stops extending the lease, which lapses, so a retry
// can take over.
func (a *attempt) bound() {
	if !a.rt.atomic && a.rt.p.maxAttempt > 0 && a.cancel != nil {
		a.timer = time.AfterFunc(a.rt.p.maxAttempt, func() {
			a.expired.Store(true)
			a.cancel(ErrAttemptTimeout)
		})
	}
}

// unbound ends the bound that bound started.
func (a *attempt) unbound() {
	switch {
	case a.timer != nil:
		a.timer.Stop()
	case a.stop != nil:
		a.stop()
	}
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
func (rt *Route) replay(_ context.Context, rec store.Record) answer {
	resp, err := rt.e.openResponse(rec.ID, rec.Response)
	if err != nil {
		return answer{rec: rec, err: storeErr(err), decision: observe.DecisionStoreError}
	}
	return answer{rec: rec, resp: resp, decision: observe.DecisionReplayed}
}

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
func (rt *Route) applyResolver(ctx context.Context, rec store.Record, req *RecordedRequest) (Outcome, error) {
	e := rt.e
	rctx, tx := ctx, store.Tx(nil)
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
		if err == nil {
			err = e.releaseGuard(rctx, rec.ID) // nothing happened: the next attempt may mark its effect
		}
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
			err = e.store.Complete(rctx, rec.ID, rec.Token, store.Completion{State: store.StateCompleted, Status: resp.Status,
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
func (rt *Route) resolve(ctx context.Context, rec store.Record) (a answer, retry bool) {
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
			return answer{rec: rec, err: storeErr(err), decision: observe.DecisionStoreError}, false
		case outcome == OutcomeNotApplied:
			return answer{}, true // released (by us, or by another settler): claim again
		case outcome == OutcomeApplied:
			// Settled (by us, or concurrently by another settler): read back.
			got, err := e.store.Get(ctx, rec.ID, e.cfg.clock())
			if errors.Is(err, ErrNotFound) {
				return answer{}, true // expired or released meanwhile: claim again
			}
			if err != nil {
				return answer{rec: rec, err: storeErr(err), decision: observe.DecisionStoreError}, false
			}
			if got.State != store.StateCompleted {
				return answer{}, true // another attempt holds it now: claim again, and decide from what it is
			}
			a := rt.replay(ctx, got)
			a.decision = observe.DecisionResolved
			return a, false
		default:
			// Unresolved. Another settler (a replica's completer, its
			// finisher) may have settled or claimed the record while the
			// resolver was asked: answer from what it is now, not from
			// what was read before.
			got, err := e.store.Get(ctx, rec.ID, e.cfg.clock())
			if errors.Is(err, ErrNotFound) || (err == nil && got.Token != rec.Token) {
				return answer{}, true // claim again, and decide from what it is
			}
		}
	}
	return rt.indeterminate(ctx, rec), false
}

// indeterminate is the answer from an indeterminate record: its recorded
// answer (500 outcome-unknown, or the completer's).
func (rt *Route) indeterminate(ctx context.Context, rec store.Record) answer {
	a := rt.replay(ctx, rec)
	if a.err == nil {
		a.decision = observe.DecisionIndeterminate
	}
	return a
}

// abandonedClaim reports whether rec is an atomic-mode claim (in progress,
// no lease) that was committed, so its row is visible (a store's probe of
// an uncommitted claim returns neither token nor creation time), and
// older than the route's MaxAttempt: every attempt ends by then (its
// context does, and with it its transaction), so nothing can still be
// completing it. With MaxAttempt turned off nothing is assumed.
func (rt *Route) abandonedClaim(rec store.Record, now time.Time) bool {
	return rec.LeaseUntil.IsZero() && rec.Token != 0 && !rec.CreatedAt.IsZero() &&
		rt.p.maxAttempt > 0 && !now.Before(rec.CreatedAt.Add(rt.p.maxAttempt))
}

// markIndeterminate turns an in-progress record whose lease lapsed into an
// indeterminate one (WithoutTakeover()), or an abandoned atomic claim
// (Route.abandonedClaim).
//
// The record keeps its expiry when that is later than the route's
// retention from now: shortening it would let a retry run the handler
// again within the window the route promised.
func (rt *Route) markIndeterminate(ctx context.Context, rec store.Record) {
	e := rt.e
	expires := e.cfg.clock().Add(rt.p.retention)
	if rec.ExpiresAt.After(expires) {
		expires = rec.ExpiresAt
	}
	p := e.problemFor(clientErrorf(ErrIndeterminate, "the attempt holding the key stopped before recording an outcome"))
	p.RecordID = rec.ID.String()
	resp := problemResponse(p)
	blob, err := e.sealResponse(rec.ID, resp, nil)
	if err == nil {
		err = e.store.Complete(ctx, rec.ID, rec.Token, store.Completion{State: store.StateIndeterminate, Status: resp.Status,
			Response: blob, ExpiresAt: expires})
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

// end classifies how the handler ended (resp's status, or a panic),
// records the outcome (finish) and puts the decision and finish's error in
// ev. It returns finish's error.
func (a *attempt) end(ev *observe.Event, resp *Response, panicked bool) error {
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

// guardEffect makes an atomic attempt's MarkEffect durable before the
// effect happens (see MarkEffect): it claims the record's effect guard
// (store.ID.EffectGuard) under the attempt's token, outside the attempt's
// transaction (autocommit, on a connection of its own), held until the
// record expires. The claim of the record itself lives in the attempt's
// transaction, and a transaction can end without the engine: a session
// the database killed while the handler waits on its provider, a COMMIT
// lost while the database is out of reach. The record is then absent, and
// only the guard says that an effect may have happened: a later attempt of
// the request meets it here, and its outcome is indeterminate
// (attempt.refused) instead of a second effect.
//
// Leased mode needs no guard (the claim commits before the handler runs),
// nor does a store whose database runs in the process (store.Embedded).
// Only the first MarkEffect of an attempt writes; the later ones return
// its result.
func (a *attempt) guardEffect(ctx context.Context) error {
	e := a.e
	if !a.rt.atomic || !e.guards {
		return nil
	}
	a.guardMu.Lock()
	defer a.guardMu.Unlock()
	if a.guardDone {
		return a.guardErr
	}
	a.guardDone = true
	req := a.rt.claimRequest(a.ident, a.id.EffectGuard(), a.fp, e.cfg.clock())
	req.Scope = guardScope // the listing of records leaves guards out (Engine.Records)
	req.Token, req.LeaseUntil, req.ExpiresAt = a.token, a.expires, a.expires
	gctx, cancel := context.WithTimeout(e.tx.WithoutTx(ctx), guardWait)
	res, err := e.store.Claim(gctx, req)
	cancel()
	switch {
	case err != nil:
		a.guardErr = fmt.Errorf("%w: core.MarkEffect: the effect guard could not be written, so a transaction that ends without the engine would lose the record of the effect; do not start it: %w",
			ErrStoreUnavailable, err)
	case res.Claimed || res.Record.Token == a.token:
	default:
		a.refused.Store(true)
		a.guardErr = fmt.Errorf("core.MarkEffect: %w; do not start it (the record is settled as indeterminate: resolve it, or release it once the effect is known not to have happened)", errGuarded)
		e.cfg.logger.ErrorContext(ctx, "idempotency: an earlier attempt's effect guard is there: this attempt's outcome is indeterminate",
			slog.String("id", a.id.String()))
	}
	return a.guardErr
}

// guardWait bounds the effect guard's claim: the time to get a
// connection of its own (the attempt's transaction holds one: a pool of
// one connection would wait for ever) and run one statement.
const guardWait = 5 * time.Second

// guardScope is the scope recorded with an effect guard, which no route
// may use (Scope refuses it): the guard keeps its record's caller and key,
// for an operator who reads it (Engine.Record).
const guardScope = "idem/effect-guard"

// releaseGuard removes the effect guard of id, if any, in the transaction
// ctx carries (if any): a record released by an operator or a resolver
// (nothing happened) must let the next attempt's MarkEffect through.
func (e *Engine) releaseGuard(ctx context.Context, id store.ID) error {
	if !e.guards {
		return nil
	}
	gid := id.EffectGuard()
	rec, err := e.store.Get(ctx, gid, e.cfg.clock())
	switch {
	case errors.Is(err, ErrNotFound):
		return nil
	case err != nil:
		return err
	}
	if err := e.store.Release(ctx, gid, rec.Token); err != nil && !errors.Is(err, ErrFenced) {
		return err
	}
	return nil
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
func (a *attempt) finish(v verdict, resp *Response) (observe.Decision, error) {
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
func (a *attempt) record(v verdict, resp *Response) (observe.Decision, error) {
	e := a.e
	lost := e.unhold(a)
	local := a.localTx(v == vRelease || lost) // leased mode: the handler's local writes
	var replaced error                        // the handler's answer is not true: the client gets this
	if a.refused.Load() {
		// MarkEffect met an earlier attempt's effect guard (guardEffect):
		// that attempt's effect may have happened and its transaction
		// never committed. This attempt's writes would repeat its work
		// without knowing, so they roll back, and the record becomes
		// indeterminate, whatever the handler answered.
		replaced = errGuarded
		if a.tx != nil {
			_ = a.tx.Rollback()
			return a.afterAbort(vIndeterminate, resp, errGuarded)
		}
		// The caller's or the service's transaction: it commits the
		// indeterminate record; the engine cannot roll it back.
		v, resp, a.recordAllow = vIndeterminate, a.problemAnswer(errGuarded), nil
	}
	if v == vRelease && a.tx != nil && resp != nil && resp.Status >= 500 {
		if err := a.lostClaim(); err != nil {
			_ = a.tx.Rollback()
			return observe.DecisionRejectedBusy, &RetryError{Err: fmt.Errorf("%w: %w", ErrInProgress, err), RetryAfter: e.cfg.retryAfter}
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
			return observe.DecisionLeaseLost, nil
		}
		if err != nil {
			msg := "idempotency: releasing a record failed; it stays in progress until its lease lapses"
			if a.joined {
				msg = "idempotency: releasing a record in the caller's transaction failed; roll that transaction back to release it"
			}
			e.cfg.logger.Error(msg, slog.String("id", a.id.String()), slog.String("error", err.Error()))
		}
		return observe.DecisionReleased, nil
	}
	if lost {
		if a.tx != nil {
			_ = a.tx.Rollback()
		}
		return observe.DecisionLeaseLost, &RetryError{Err: ErrLeaseLost, RetryAfter: e.cfg.retryAfter}
	}
	if a.panicked && a.tx != nil {
		// Middleware-managed atomic mode, a panic after MarkEffect: the
		// handler's writes are half done (a debit without its credit), so
		// none of them commit; the indeterminate outcome is recorded in a
		// transaction of the engine's own (all or nothing, as a crash).
		_ = a.tx.Rollback()
		return a.afterAbort(v, resp, errPanicked)
	}
	c, decision := completion(v, resp, a.completionExpiry())
	blob, err := e.sealResponse(a.id, resp, a.recordAllow)
	if err == nil {
		c.Response = blob
		cctx := a.storeCtx()
		if local != nil {
			cctx = a.lctx // the completion commits with the handler's local writes
		}
		err = e.store.Complete(cctx, a.id, a.token, c)
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
		if a.tx != nil && errors.Is(err, ErrFenced) && !errors.Is(err, ErrLostRace) {
			// The claim is gone from a transaction the engine still holds
			// open: the server rolled it back under the handler (a MariaDB
			// deadlock victim, a ROLLBACK the handler sent as a statement),
			// and the session left it, so the handler's statements after
			// that ran in autocommit and are committed. Nothing tells
			// which: never released (afterAbort).
			a.vanished = true
		}
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
			return observe.DecisionLeaseLost, &RetryError{Err: ErrLeaseLost, RetryAfter: e.cfg.retryAfter}
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
			return observe.DecisionRejectedBusy, &RetryError{Err: fmt.Errorf("%w: %w", ErrInProgress, err), RetryAfter: e.cfg.retryAfter}
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
			return observe.DecisionStoreError, &RetryError{Err: err, RetryAfter: e.cfg.retryAfter}
		}
		if !a.rt.atomic && a.effect() {
			// Leased mode: the effect may have happened and its answer is
			// not recorded. The client is told to come back for the
			// outcome (a takeover settles it, with its downstream keys),
			// never given an unrecorded answer it may not retry.
			e.cfg.logger.Error("idempotency: the answer after MarkEffect could not be recorded; the client is told its outcome is being settled",
				slog.String("id", a.id.String()), slog.Int("status", resp.Status), slog.String("error", err.Error()))
			return observe.DecisionStoreError, &RetryError{Err: fmt.Errorf("%w: %w", ErrOutcomePending, err), RetryAfter: e.cfg.retryAfter}
		}
		return observe.DecisionStoreError, &RetryError{Err: storeErr(err), RetryAfter: e.cfg.retryAfter}
	}
	return decision, replaced
}

// errGuarded is the outcome of an attempt whose MarkEffect met an earlier
// attempt's effect guard (guardEffect).
var errGuarded = fmt.Errorf("%w: an earlier attempt of this request marked an external effect and its transaction never committed, so the effect may have happened", ErrIndeterminate)

// problemAnswer is the recorded answer that replaces the handler's when
// err, not the handler's answer, is the truth: err's problem document,
// naming the record.
func (a *attempt) problemAnswer(err error) *Response {
	p := a.e.problemFor(err)
	p.RecordID = a.id.String() // as the client's own copy of it
	return problemResponse(p)
}

// completion is the completion of an attempt whose verdict v is
// vComplete or vIndeterminate, with resp's status, expiring at expires,
// and the decision it stands for (its Response is the caller's to set).
func completion(v verdict, resp *Response, expires time.Time) (store.Completion, observe.Decision) {
	if v == vIndeterminate {
		return store.Completion{State: store.StateIndeterminate, Status: resp.Status, ExpiresAt: expires}, observe.DecisionIndeterminate
	}
	return store.Completion{State: store.StateCompleted, Status: resp.Status, ExpiresAt: expires}, observe.DecisionExecuted
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
func (a *attempt) localTx(discard bool) store.Tx {
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
func (rt *Route) afterLostRace(ctx context.Context, id store.ID, fp []byte, start time.Time) answer {
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
	busy := answer{rec: store.Record{ID: id, State: store.StateInProgress}, err: &RetryError{Err: ErrInProgress, RetryAfter: e.cfg.retryAfter}, decision: observe.DecisionRejectedBusy}
	for {
		rec, err := e.store.Get(ctx, id, e.cfg.clock())
		switch {
		case errors.Is(err, ErrNotFound):
			// The winner's commit has not reached this node yet (or it
			// was rolled back too).
		case err != nil:
			return answer{err: storeErr(err), decision: observe.DecisionStoreError}
		case len(fp) > 0 && len(rec.Fingerprint) > 0 && !bytes.Equal(fp, rec.Fingerprint):
			return answer{rec: rec, err: ErrMismatch, decision: observe.DecisionMismatch}
		case rec.State == store.StateCompleted:
			return rt.replay(ctx, rec)
		case rec.State == store.StateIndeterminate:
			a := rt.replay(ctx, rec)
			if a.err == nil {
				a.decision = observe.DecisionIndeterminate
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

// --- the aborted transaction -----------------------------------------------

// afterAbort settles an attempt whose transaction the database aborted
// before its outcome was recorded (ErrTxAborted from Complete): on
// Postgres a statement of the handler failed (a unique violation the
// handler answered with 409, say), and every later statement, the
// completion included, is refused until the transaction ends. MySQL/MariaDB
// and SQLite undo the failed statement alone and record the answer in the
// handler's transaction; the client must see the same there. Nothing is
// added to the normal path (no savepoint per request): this runs only
// after the abort.
//
// Caller-managed (the caller's transaction): the engine cannot roll it
// back, so it returns err (ErrTxAborted, not ErrStoreUnavailable) and the
// caller rolls back.
//
// Route.Within, after the service's transaction failed to commit once the
// handler marked an effect, is settled as middleware-managed.
//
// Middleware-managed: the transaction has been rolled back, with the
// handler's writes and the claim, so a response that holds without those
// writes is recorded in a short transaction of the engine's own, which
// claims the identity again and completes it:
//   - a 4xx: completed, replayed to retries, as on the other databases;
//   - a 5xx after MarkEffect: indeterminate, as always;
//   - a 2xx or 3xx after MarkEffect: indeterminate (the external effect may
//     have happened, the handler's writes did not), with a problem as the
//     recorded response, which the client gets too (an error wrapping
//     ErrIndeterminate), never the success the handler answered;
//   - a 2xx or 3xx without an effect: not recorded (its writes are gone,
//     so the success is not true): the key is free again and the client
//     gets 503, as for a failed commit.
//
// If another request of the identity claimed it between the rollback and
// the new claim, the handler does not run again and the client gets that
// request's in-flight answer (409 with Retry-After; its retry gets the
// other request's recorded answer), or 422 if it was a different request.
//
// A lost race (ErrLostRace, which a MySQL/MariaDB deadlock victim or a
// failed Galera certification matches besides ErrTxAborted) comes here
// only after MarkEffect (see record): without an effect it is answered as
// the duplicate it was (afterLostRace). If the new claim or its commit
// loses a race too, another attempt holds the identity: 409, as above.
// abortedHolderWait bounds how long afterAbort claims again while the
// identity is held by a transaction it cannot see (the attempt's own dead
// one, until the server has rolled it back).
const abortedHolderWait = 3 * time.Second

func (a *attempt) afterAbort(v verdict, resp *Response, err error) (observe.Decision, error) {
	e := a.e
	if a.tx == nil && !a.owned {
		return observe.DecisionStoreError, &RetryError{Err: err, RetryAfter: e.cfg.retryAfter}
	}
	allow := a.recordAllow
	var replaced error // the handler's answer is not true: the client gets this
	switch {
	case a.refused.Load():
		// An earlier attempt's effect guard (guardEffect): indeterminate,
		// whatever the handler answered.
		replaced = errGuarded
		v, allow, resp = vIndeterminate, nil, a.problemAnswer(errGuarded)
	case v == vRelease:
		// Nothing happened, and the rollback took the claim: the key is
		// free and the handler's answer is true.
		return observe.DecisionReleased, nil
	case v == vIndeterminate || resp.Status >= 400:
	case a.vanished && !a.effect():
		replaced = fmt.Errorf("%w: the database rolled the handler's transaction back under it, and the statements it ran after that committed in autocommit", ErrIndeterminate)
		e.cfg.logger.Error("idempotency: the claim was gone from the attempt's open transaction (the database rolled it back under the handler: a deadlock victim, or a ROLLBACK sent as a statement); "+
			"the handler's later statements ran in autocommit, so the outcome is recorded indeterminate. Roll back by answering a 5xx or with core.Release, never with a ROLLBACK statement; on a deadlock, answer an error instead of retrying the statement",
			slog.String("id", a.id.String()), slog.Int("status", resp.Status))
		v, allow = vIndeterminate, nil
		resp = a.problemAnswer(replaced)
	case a.effect():
		replaced = fmt.Errorf("%w: the handler's transaction was aborted after it marked an external effect", ErrIndeterminate)
		v, allow = vIndeterminate, nil
		resp = a.problemAnswer(replaced)
	default:
		e.cfg.logger.Error("idempotency: the handler answered success, but a statement of its transaction failed and the database aborted it: rolled back, the key is free again",
			slog.String("id", a.id.String()), slog.Int("status", resp.Status), slog.String("error", err.Error()))
		return observe.DecisionStoreError, &RetryError{Err: storeErr(err), RetryAfter: e.cfg.retryAfter}
	}
	fail := func(err error) (observe.Decision, error) {
		if errors.Is(err, ErrLostRace) {
			// The short transaction lost to another attempt's claim of the
			// identity (on Galera: certified first, not yet applied here):
			// that attempt holds the key; answer as its duplicate.
			return observe.DecisionRejectedBusy, &RetryError{Err: fmt.Errorf("%w: %w", ErrInProgress, err), RetryAfter: e.cfg.retryAfter}
		}
		return observe.DecisionStoreError, &RetryError{Err: storeErr(err), RetryAfter: e.cfg.retryAfter}
	}
	ctx := e.tx.WithoutTx(a.storeCtx())
	req := a.rt.claimRequest(a.ident, a.id, a.fp, e.cfg.clock())
	req.Token = a.token
	if a.rt.p.name != "" && e.settler != nil {
		// The rollback took the first claim's mark with it: this claim
		// writes it again, or the completer would never find the
		// indeterminate record it is there to settle.
		req.Mark = a.rt.mark(a.ctx, req.Now)
	}
	var (
		tctx context.Context
		tx   store.Tx
		res  store.ClaimResult
	)
	// A session the database killed, or a connection dropped under the
	// transaction, is rolled back by the server a moment after the engine
	// learns of it; until then the dead transaction still holds the
	// identity, and the claim's probe reports it as held by a transaction
	// it cannot see (no token). Claim again until it is gone, for a
	// bounded time: giving up would leave a marked effect unrecorded, to
	// run again at the next retry.
	for wait, deadline := 5*time.Millisecond, time.Now().Add(abortedHolderWait); ; wait = min(2*wait, 100*time.Millisecond) {
		tctx, tx, err = e.tx.Begin(ctx)
		if err != nil {
			return fail(err)
		}
		res, err = e.store.Claim(tctx, req)
		if err != nil || res.Claimed || res.Record.Token != 0 || !time.Now().Add(wait).Before(deadline) || ctx.Err() != nil {
			break
		}
		_ = tx.Rollback()
		time.Sleep(wait)
	}
	if err != nil || !res.Claimed {
		_ = tx.Rollback()
		switch {
		case err != nil:
			return fail(err)
		case res.Record.Token == a.token && res.Record.State != store.StateInProgress:
			// The transaction did commit after all (a COMMIT whose answer
			// was lost, still being applied when the record was read).
			return a.committed(res.Record)
		case len(a.fp) > 0 && len(res.Record.Fingerprint) > 0 && !bytes.Equal(a.fp, res.Record.Fingerprint):
			return observe.DecisionMismatch, ErrMismatch
		case res.Record.Token == 0 && a.effect():
			// Still held, past the bounded wait, by a transaction the
			// engine cannot see: most likely the attempt's own, which the
			// server keeps open (a partition: it has not noticed the
			// connection is gone). The effect guard keeps the effect
			// known to every later attempt; the client is told that the
			// outcome is being settled, not that another attempt holds
			// the key.
			e.cfg.logger.Error("idempotency: after MarkEffect the attempt's transaction ended, and the identity is still held by a transaction the engine cannot see; the client is told its outcome is being settled",
				slog.String("id", a.id.String()))
			return observe.DecisionStoreError, &RetryError{Err: fmt.Errorf("%w: the identity is still held by a transaction on the server", ErrOutcomePending), RetryAfter: e.cfg.retryAfter}
		}
		return observe.DecisionRejectedBusy, &RetryError{Err: ErrInProgress, RetryAfter: e.cfg.retryAfter}
	}
	c, decision := completion(v, resp, req.ExpiresAt) // as finish: the claim's
	c.Response, err = e.sealInto(nil, a.id, resp, allow)
	if err == nil {
		err = e.store.Complete(tctx, a.id, a.token, c)
	}
	if err == nil {
		err = tx.Commit()
	}
	if err != nil {
		_ = tx.Rollback()
		return fail(err)
	}
	return decision, replaced
}

// afterEnd settles an attempt in atomic mode whose transaction ended other
// than by the engine's successful commit (docs/contract.md, section 4 "The
// transaction's end is part of the outcome"): a constraint checked at
// COMMIT, a serialization failure, a deadlock victim (on MariaDB the
// server rolls back under the handler and the completion then finds no
// claim: ErrFenced), a session the database killed, a connection lost
// during COMMIT (the outcome unknown), a cancelled context, or the
// handler's own Commit or Rollback of the shared transaction. cause is the
// error that showed it.
//
// The engine rolls back what is left and reads the record on a connection
// of its own, whatever the request's context (its client may be gone):
//   - completed or indeterminate with the attempt's token: the commit did
//     happen; the handler's answer stands.
//   - in progress with the attempt's token: the handler committed the
//     shared transaction itself, with the claim and its writes; the
//     outcome is recorded now in a transaction of the engine's own, the
//     handler's writes counting as an effect (they are durable), so the
//     key is never left locked and never released under committed writes.
//   - another attempt's record: that attempt holds the key (the rollback
//     let it claim): 409, or 422 for another request.
//   - absent: as after an abort (afterAbort): after MarkEffect the outcome
//     is recorded indeterminate; a 4xx is recorded; a success without an
//     effect is not (its writes are gone): the key is free and the client
//     gets 503 with Retry-After.
//   - the record cannot be read: after MarkEffect the client is told the
//     outcome is being settled (ErrOutcomePending, 503 with Retry-After),
//     else the store is unavailable; the retry reads the record again.
//
// Route.Within settles the service's failed commit the same way
// (a.owned: the service's transaction, which it rolled back).
func (a *attempt) afterEnd(v verdict, resp *Response, cause error) (observe.Decision, error) {
	e := a.e
	if a.tx != nil {
		_ = a.tx.Rollback() // a dead or ended transaction: frees its connection
	}
	a.owned = true // settled in transactions of the engine's own from here
	ctx := e.tx.WithoutTx(context.WithoutCancel(a.ctx))
	e.cfg.logger.WarnContext(ctx, "idempotency: the attempt's transaction ended before the engine committed it; settling from the record",
		slog.String("id", a.id.String()), slog.Int("status", resp.Status), slog.Bool("effect", a.effect()), slog.String("error", cause.Error()))
	rec, err := e.store.Get(ctx, a.id, e.cfg.clock())
	switch {
	case err == nil && rec.Token == a.token && rec.State != store.StateInProgress:
		return a.committed(rec)
	case err == nil && rec.Token == a.token:
		e.cfg.logger.ErrorContext(ctx, "idempotency: the handler committed the shared transaction itself (the claim and its writes committed before the answer was recorded); "+
			"the engine records the answer now. Do not Commit or Rollback the transaction of sqlstore.Tx / gormstore.DB: answer a 5xx, or call core.Release, to roll it back",
			slog.String("id", a.id.String()))
		if v == vRelease {
			v = vComplete // the handler's writes are durable: never released under them
			if resp.Status >= 500 {
				v = vIndeterminate
			}
		}
		return a.recordOwn(v, resp, a.recordAllow)
	case err == nil:
		if len(a.fp) > 0 && len(rec.Fingerprint) > 0 && !bytes.Equal(a.fp, rec.Fingerprint) {
			return observe.DecisionMismatch, ErrMismatch
		}
		return observe.DecisionRejectedBusy, &RetryError{Err: ErrInProgress, RetryAfter: e.cfg.retryAfter}
	case errors.Is(err, ErrNotFound):
		if a.ctx.Err() != nil && v != vIndeterminate && resp.Status < 400 && !a.effect() && !a.vanished {
			// The transaction's context ended (MaxAttempt passed, or a
			// caller's context) and the database rolled it back: nothing
			// happened, a release.
			return observe.DecisionReleased, &RetryError{Err: storeErr(cause), RetryAfter: e.cfg.retryAfter}
		}
		return a.afterAbort(v, resp, cause)
	}
	if v == vIndeterminate || a.effect() {
		return observe.DecisionStoreError, &RetryError{Err: fmt.Errorf("%w: %w", ErrOutcomePending, errors.Join(cause, err)), RetryAfter: e.cfg.retryAfter}
	}
	return observe.DecisionStoreError, &RetryError{Err: storeErr(errors.Join(cause, err)), RetryAfter: e.cfg.retryAfter}
}

// committed is the decision for an attempt whose transaction committed
// although the engine saw its commit fail: rec, the attempt's record, says
// how it ended; the handler's answer stands.
func (a *attempt) committed(rec store.Record) (observe.Decision, error) {
	if rec.State == store.StateIndeterminate {
		return observe.DecisionIndeterminate, nil
	}
	return observe.DecisionExecuted, nil
}

// recordOwn completes the attempt's claim, which committed in progress
// (the handler committed the shared transaction), in a short transaction
// of the engine's own, fenced by the attempt's token.
func (a *attempt) recordOwn(v verdict, resp *Response, allow []string) (observe.Decision, error) {
	e := a.e
	ctx := e.tx.WithoutTx(context.WithoutCancel(a.ctx))
	c, decision := completion(v, resp, a.completionExpiry())
	blob, err := e.sealInto(nil, a.id, resp, allow)
	if err != nil {
		return observe.DecisionStoreError, &RetryError{Err: fmt.Errorf("%w: %w", ErrOutcomePending, err), RetryAfter: e.cfg.retryAfter}
	}
	c.Response = blob
	tctx, tx, err := e.tx.Begin(ctx)
	if err == nil {
		if err = e.store.Complete(tctx, a.id, a.token, c); err == nil {
			err = tx.Commit()
		} else {
			_ = tx.Rollback()
		}
	}
	if err != nil {
		return observe.DecisionStoreError, &RetryError{Err: fmt.Errorf("%w: %w", ErrOutcomePending, err), RetryAfter: e.cfg.retryAfter}
	}
	return decision, nil
}

// afterLocalEnd settles a leased attempt whose transaction of local writes
// (withLocalTx) ended other than by the engine's commit of it with the
// completion: the completion failed in it (the handler committed or
// rolled it back itself, a statement of the handler failed and Postgres
// aborted it, its session was killed), or its COMMIT failed (a constraint
// checked at COMMIT) or its outcome is unknown. cause is the error;
// committing reports that the completion ran and the COMMIT was the
// engine's (so the handler did not end the transaction itself).
//
// The record is on its own connection, committed in progress since the
// claim, so it tells whether the transaction committed: completed with the
// attempt's token, it did (the handler's answer stands). Still in progress
// with the token, it did not, and the outcome is recorded now on the
// record's own connection, fenced, as in atomic mode (afterAbort):
// indeterminate after MarkEffect (a success becomes the 500 outcome-unknown
// problem: its writes are gone); a 4xx recorded; a success without an
// effect released, the client told 503 with Retry-After. When the handler
// may have committed the transaction itself (the completion failed, not
// the engine's COMMIT), its writes may be durable: nothing is released,
// and a success is recorded indeterminate. Another attempt's record: the
// lease was lost.
func (a *attempt) afterLocalEnd(v verdict, resp *Response, cause error, committing bool) (observe.Decision, error) {
	e := a.e
	ctx := a.storeCtx()
	e.cfg.logger.WarnContext(ctx, "idempotency: the leased attempt's transaction of local writes ended before the engine committed it; settling from the record",
		slog.String("id", a.id.String()), slog.Int("status", resp.Status), slog.Bool("effect", a.effect()), slog.String("error", cause.Error()))
	rec, err := e.store.Get(ctx, a.id, e.cfg.clock())
	switch {
	case err == nil && rec.Token == a.token && rec.State != store.StateInProgress:
		return a.committed(rec)
	case err == nil && rec.Token != a.token, errors.Is(err, ErrNotFound):
		return observe.DecisionLeaseLost, &RetryError{Err: ErrLeaseLost, RetryAfter: e.cfg.retryAfter}
	case err != nil:
		if v == vIndeterminate || a.effect() || !committing {
			return observe.DecisionStoreError, &RetryError{Err: fmt.Errorf("%w: %w", ErrOutcomePending, errors.Join(cause, err)), RetryAfter: e.cfg.retryAfter}
		}
		return observe.DecisionStoreError, &RetryError{Err: storeErr(errors.Join(cause, err)), RetryAfter: e.cfg.retryAfter}
	}
	// In progress with our token: nothing of the transaction committed,
	// unless the handler committed it itself.
	allow := a.recordAllow
	var replaced error
	switch { // (a release never gets here: its transaction is rolled back unused)
	case v == vIndeterminate || resp.Status >= 400:
	case a.effect() || !committing:
		replaced = fmt.Errorf("%w: the attempt's transaction of local writes did not commit with its answer", ErrIndeterminate)
		v, allow = vIndeterminate, nil
		p := e.problemFor(replaced)
		p.RecordID = a.id.String()
		resp = problemResponse(p)
	}
	if v == vComplete && replaced == nil && resp.Status < 400 {
		// Nothing happened that lasts: the key is free, and the client is
		// told so.
		if err := e.store.Release(ctx, a.id, a.token); err != nil && !errors.Is(err, ErrFenced) {
			e.cfg.logger.ErrorContext(ctx, "idempotency: releasing a record failed; it stays in progress until its lease lapses", slog.String("id", a.id.String()), slog.String("error", err.Error()))
		}
		return observe.DecisionReleased, &RetryError{Err: storeErr(cause), RetryAfter: e.cfg.retryAfter}
	}
	c, decision := completion(v, resp, a.completionExpiry())
	c.Response, err = e.sealInto(nil, a.id, resp, allow)
	if err == nil {
		err = e.store.Complete(ctx, a.id, a.token, c)
	}
	switch {
	case errors.Is(err, ErrFenced):
		return observe.DecisionLeaseLost, &RetryError{Err: ErrLeaseLost, RetryAfter: e.cfg.retryAfter}
	case err != nil:
		return observe.DecisionStoreError, &RetryError{Err: fmt.Errorf("%w: %w", ErrOutcomePending, err), RetryAfter: e.cfg.retryAfter}
	}
	return decision, replaced
}
