package core

import (
	"context"
	"errors"
	"fmt"

	"github.com/idemkit/idem/core/observe"
	"github.com/idemkit/idem/core/store"
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
	o := &onceCall{fn: fn}
	c := &o.call
	ident := store.Identity{Scope: "consumer " + m.Consumer, Key: m.ID}
	c.route, c.start, c.ident, c.fingerprint = rt, e.cfg.clock(), ident, normalFingerprint(m.Fingerprint)
	c.ev = observe.Event{ID: ident.ID(), Scope: ident.Scope, Key: m.ID}
	c.ctx = context.WithValue(ctx, attemptKey{}, c)
	rt.step(&job{c: c, ctx: c.ctx, keepCancel: true}, transport{handle: o.handle, panicked: o.panicked, reply: o.reply})
	return o.res, o.err
}

// onceCall is Once's transport: fn's error is a 500 (the work did not
// happen, unless an effect was marked: then its outcome is unknown), nil
// a 200 with its value.
type onceCall struct {
	call
	fn         func(ctx context.Context) ([]byte, error)
	res        Result
	err, fnErr error
}

func (o *onceCall) handle(ctx context.Context) (*Response, bool, error) {
	if o.res.Value, o.fnErr = o.fn(ctx); o.fnErr != nil {
		return &Response{Status: 500, BodyKept: true}, false, nil
	}
	return &Response{Status: 200, Body: o.res.Value, BodyKept: true}, false, nil
}

func (o *onceCall) panicked(any) *Response { return &Response{Status: 500, BodyKept: true} }

func (o *onceCall) reply(r result) int {
	switch {
	case r.ran && r.void == nil:
		o.ev.Err, o.err = errors.Join(o.fnErr, r.err), r.err
		if o.fnErr != nil {
			o.err = o.fnErr
		}
		if o.err != nil {
			o.res = Result{}
		}
	case r.reject != nil:
		o.res, o.err = Result{}, r.reject
	case o.ev.Decision == observe.DecisionIndeterminate:
		o.res, o.err = Result{}, fmt.Errorf("%w (%s)", ErrIndeterminate, o.ev.ID)
	case !r.ans.resp.kept:
		o.res, o.err = Result{Replayed: true}, ErrNotKept
	default:
		o.res = Result{Value: r.ans.resp.body, Replayed: true}
	}
	return 0
}
