package core

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
)

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
func (a *attempt) afterAbort(v verdict, resp *Response, err error) (Decision, error) {
	e := a.e
	if a.tx == nil && !a.owned {
		return DecisionStoreError, &RetryError{Err: err, RetryAfter: e.cfg.retryAfter}
	}
	allow := a.recordAllow
	var replaced error // the handler's answer is not true: the client gets this
	switch {
	case v == vIndeterminate || resp.Status >= 400:
	case a.effect.Load():
		replaced = fmt.Errorf("%w: the handler's transaction was aborted after it marked an external effect", ErrIndeterminate)
		v, allow = vIndeterminate, nil
		resp = problemResponse(e.problemFor(replaced))
	default:
		e.cfg.logger.Error("idempotency: the handler answered success, but a statement of its transaction failed and the database aborted it: rolled back, the key is free again",
			slog.String("id", a.id.String()), slog.Int("status", resp.Status), slog.String("error", err.Error()))
		return DecisionStoreError, &RetryError{Err: storeErr(err), RetryAfter: e.cfg.retryAfter}
	}
	fail := func(err error) (Decision, error) {
		if errors.Is(err, ErrLostRace) {
			// The short transaction lost to another attempt's claim of the
			// identity (on Galera: certified first, not yet applied here):
			// that attempt holds the key; answer as its duplicate.
			return DecisionRejectedBusy, &RetryError{Err: fmt.Errorf("%w: %w", ErrInProgress, err), RetryAfter: e.cfg.retryAfter}
		}
		return DecisionStoreError, &RetryError{Err: storeErr(err), RetryAfter: e.cfg.retryAfter}
	}
	ctx := e.tx.WithoutTx(a.storeCtx())
	req := a.rt.claimRequest(a.ident, a.id, a.fp, e.cfg.clock())
	req.Token = a.token
	tctx, tx, err := e.tx.Begin(ctx)
	if err != nil {
		return fail(err)
	}
	res, err := e.store.Claim(tctx, req)
	if err != nil || !res.Claimed {
		_ = tx.Rollback()
		switch {
		case err != nil:
			return fail(err)
		case len(a.fp) > 0 && len(res.Record.Fingerprint) > 0 && !bytes.Equal(a.fp, res.Record.Fingerprint):
			return DecisionMismatch, ErrMismatch
		}
		return DecisionRejectedBusy, &RetryError{Err: ErrInProgress, RetryAfter: e.cfg.retryAfter}
	}
	c := Completion{State: StateCompleted, Status: resp.Status, ExpiresAt: req.ExpiresAt} // as finish: the claim's
	decision := DecisionExecuted
	if v == vIndeterminate {
		c.State, decision = StateIndeterminate, DecisionIndeterminate
	}
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

// afterClientGone settles a middleware-managed atomic attempt whose
// request's context ended (the client went away, a deadline passed) before
// its outcome was committed: the transaction, bound to that context, was
// rolled back with the handler's writes and the claim. A response that
// holds without those writes is recorded as afterAbort does (in a short
// transaction of the engine's own): above all, after MarkEffect the
// outcome is indeterminate, so a retry does not repeat the external
// effect. A success without an effect is not recorded (its writes are
// gone): the key is free again, and since a client going away is routine,
// that is a release, not a store error.
func (a *attempt) afterClientGone(v verdict, resp *Response, err error) (Decision, error) {
	if v != vIndeterminate && resp.Status < 400 && !a.effect.Load() {
		return DecisionReleased, &RetryError{Err: storeErr(err), RetryAfter: a.e.cfg.retryAfter}
	}
	return a.afterAbort(v, resp, err)
}
