package core

import (
	"context"
	"errors"
	"fmt"
)

// Message names one delivery for Once: the consumer (the unit of work) and
// the message id the producer assigned. Two consumers of the same message
// run once each.
type Message struct {
	Consumer string
	ID       string
	// Fingerprint of the payload, optional: a redelivery with a different
	// fingerprint is refused with ErrMismatch.
	Fingerprint []byte
}

// Result is what Once returns.
type Result struct {
	// Value is what the first run's function returned.
	Value []byte
	// Replayed is true when the function did not run now because an earlier
	// run completed.
	Replayed bool
}

// Once runs fn at most once per (consumer, message id) and returns the first
// run's value to duplicates. It is the non-HTTP entry point for message
// consumers and jobs (docs/contract.md, section 7 "Messages and jobs").
//
//   - First delivery: fn runs. A nil error completes the record with the
//     returned value. An error (or a panic) releases the record so a
//     redelivery runs again, unless fn called MarkEffect first: then the
//     record becomes indeterminate and duplicates get ErrIndeterminate until
//     a Resolver settles it.
//   - Completed: Result{Value, Replayed: true}; fn does not run.
//   - In progress elsewhere: an error matching ErrInProgress at once (a
//     *RetryError): "decline now", so the consumer can nack instead of
//     blocking a worker. Pass WaitInFlight to wait instead.
//   - Lost race (ErrLostRace from the store: the database rolled fn's
//     transaction back for a concurrent run of the same message, as a
//     Galera node does when another node's claim was certified first):
//     answered like the duplicate it was (the first run's value, or
//     ErrInProgress). In a caller's transaction, an error matching
//     ErrInProgress, ErrLostRace and ErrTxAborted: roll back and nack.
//
// With a TxStore, fn runs inside a transaction that commits with the record
// (fetch it from ctx with the store's accessor). If ctx already carries a
// transaction of the store (sqlstore.WithTx, gormstore.WithTx), Once joins it
// and neither commits nor rolls back: when Once returns an error, roll the
// transaction back. With the Leased option the record is written outside
// that transaction instead, on connections of its own, so the caller's
// rollback does not erase it; fn still gets ctx with the caller's
// transaction.
// An error matching ErrTxAborted says that the database aborted that
// transaction (a statement of fn failed on Postgres, a deadlock victim, a
// failed Galera certification): nothing of it can commit; run the whole
// unit again in a new one.
func (e *Engine) Once(ctx context.Context, m Message, fn func(ctx context.Context) ([]byte, error), opts ...RouteOption) (Result, error) {
	rt := e.def
	if len(opts) > 0 {
		rt = e.Route(opts...)
	}
	if m.ID == "" || len(m.ID) > MaxKeyLen {
		return Result{}, clientErrorf(ErrInvalidKey, "message id must be 1 to %d bytes", MaxKeyLen)
	}
	start := e.cfg.clock()
	ident := Identity{Scope: "consumer " + m.Consumer, Key: m.ID}
	id := ident.ID()
	ev := Event{ID: id, Scope: ident.Scope, Key: m.ID}
	var cancel context.CancelCauseFunc
	if !rt.atomic {
		ctx, cancel = context.WithCancelCause(ctx)
		defer cancel(nil)
	}
	fp := normalFingerprint(m.Fingerprint)
	// answered returns what Once returns for a run that did not execute.
	answered := func(ans answer) (Result, error) {
		switch {
		case ans.err != nil:
			return Result{}, ans.err
		case ans.decision == DecisionIndeterminate:
			return Result{}, fmt.Errorf("%w (%s)", ErrIndeterminate, id)
		case !ans.resp.kept:
			return Result{Replayed: true}, ErrNotKept
		}
		return Result{Value: ans.resp.body, Replayed: true}, nil
	}
	c := new(call)
	att, ans := rt.acquire(ctx, ident, id, fp, start, &c.att, cancel)
	ev.Claim = ans.claim
	if att == nil {
		ev.Decision, ev.Err, ev.Attempt = ans.decision, ans.err, ans.rec.Attempt
		e.emit(ctx, ev, start)
		return answered(ans)
	}
	ev.Attempt = att.number
	// Atomic mode: fn runs in the attempt's transaction. Leased mode: fn
	// gets ctx as it came (with whatever transaction the caller put in
	// it), while the attempt's own store calls hide that transaction.
	base := att.ctx
	if !rt.atomic {
		base = att.withLocalTx(ctx) // fn's local writes commit with the completion
	}
	c.claimed = true
	hctx := context.WithValue(base, attemptKey{}, c)
	defer att.bound()()
	e.hold(att)

	var value []byte
	var err error
	att.run(ctx, &ev, start, nil, func(any) *Response { return &Response{Status: 500, BodyKept: true} },
		func() { value, err = fn(hctx) })
	// fn's error is a 500 (the work did not happen, unless an effect was
	// marked: then its outcome is unknown), nil a 200 with its value.
	resp := &Response{Status: 200, Body: value, BodyKept: true}
	if err != nil {
		resp = &Response{Status: 500, BodyKept: true}
	}
	ferr := att.end(&ev, resp, false)
	decision := ev.Decision
	if rt.atomic && !att.joined && errors.Is(ferr, ErrLostRace) {
		// The database rolled our transaction back for a concurrent claim
		// (another Galera node's; fn's error, if any, was its doing): fn's
		// writes are gone; answer as the duplicate this was. In the
		// caller's transaction the caller must roll back: ferr matches
		// ErrInProgress, ErrLostRace and ErrTxAborted.
		ans := rt.afterLostRace(ctx, id, fp, start)
		ev.Decision, ev.Err = ans.decision, errors.Join(ans.err, ferr)
		e.emit(ctx, ev, start)
		return answered(ans)
	}
	ev.Decision, ev.Err = decision, errors.Join(err, ferr)
	e.emit(ctx, ev, start)
	switch {
	case err != nil:
		return Result{}, err
	case ferr != nil:
		return Result{}, ferr
	}
	return Result{Value: value}, nil
}
