package core

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"
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
// abortedHolderWait bounds how long afterAbort claims again while the
// identity is held by a transaction it cannot see (the attempt's own dead
// one, until the server has rolled it back).
const abortedHolderWait = 3 * time.Second

func (a *attempt) afterAbort(v verdict, resp *Response, err error) (Decision, error) {
	e := a.e
	if a.tx == nil && !a.owned {
		return DecisionStoreError, &RetryError{Err: err, RetryAfter: e.cfg.retryAfter}
	}
	allow := a.recordAllow
	var replaced error // the handler's answer is not true: the client gets this
	switch {
	case v == vRelease:
		// Nothing happened, and the rollback took the claim: the key is
		// free and the handler's answer is true.
		return DecisionReleased, nil
	case v == vIndeterminate || resp.Status >= 400:
	case a.effect():
		replaced = fmt.Errorf("%w: the handler's transaction was aborted after it marked an external effect", ErrIndeterminate)
		v, allow = vIndeterminate, nil
		p := e.problemFor(replaced)
		p.RecordID = a.id.String() // as the client's own copy of it
		resp = problemResponse(p)
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
	var (
		tctx context.Context
		tx   Tx
		res  ClaimResult
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
		case res.Record.Token == a.token && res.Record.State != StateInProgress:
			// The transaction did commit after all (a COMMIT whose answer
			// was lost, still being applied when the record was read).
			return a.committed(res.Record)
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
func (a *attempt) afterEnd(v verdict, resp *Response, cause error) (Decision, error) {
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
	case err == nil && rec.Token == a.token && rec.State != StateInProgress:
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
			return DecisionMismatch, ErrMismatch
		}
		return DecisionRejectedBusy, &RetryError{Err: ErrInProgress, RetryAfter: e.cfg.retryAfter}
	case errors.Is(err, ErrNotFound):
		if a.ctx.Err() != nil && v != vIndeterminate && resp.Status < 400 && !a.effect() {
			// The transaction's context ended (MaxAttempt passed, or a
			// caller's context) and the database rolled it back: nothing
			// happened, a release.
			return DecisionReleased, &RetryError{Err: storeErr(cause), RetryAfter: e.cfg.retryAfter}
		}
		return a.afterAbort(v, resp, cause)
	}
	if v == vIndeterminate || a.effect() {
		return DecisionStoreError, &RetryError{Err: fmt.Errorf("%w: %w", ErrOutcomePending, errors.Join(cause, err)), RetryAfter: e.cfg.retryAfter}
	}
	return DecisionStoreError, &RetryError{Err: storeErr(errors.Join(cause, err)), RetryAfter: e.cfg.retryAfter}
}

// committed is the decision for an attempt whose transaction committed
// although the engine saw its commit fail: rec, the attempt's record, says
// how it ended; the handler's answer stands.
func (a *attempt) committed(rec Record) (Decision, error) {
	if rec.State == StateIndeterminate {
		return DecisionIndeterminate, nil
	}
	return DecisionExecuted, nil
}

// recordOwn completes the attempt's claim, which committed in progress
// (the handler committed the shared transaction), in a short transaction
// of the engine's own, fenced by the attempt's token.
func (a *attempt) recordOwn(v verdict, resp *Response, allow []string) (Decision, error) {
	e := a.e
	ctx := e.tx.WithoutTx(context.WithoutCancel(a.ctx))
	c := Completion{State: StateCompleted, Status: resp.Status, ExpiresAt: a.completionExpiry()}
	decision := DecisionExecuted
	if v == vIndeterminate {
		c.State, decision = StateIndeterminate, DecisionIndeterminate
	}
	blob, err := e.sealInto(nil, a.id, resp, allow)
	if err != nil {
		return DecisionStoreError, &RetryError{Err: fmt.Errorf("%w: %w", ErrOutcomePending, err), RetryAfter: e.cfg.retryAfter}
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
		return DecisionStoreError, &RetryError{Err: fmt.Errorf("%w: %w", ErrOutcomePending, err), RetryAfter: e.cfg.retryAfter}
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
func (a *attempt) afterLocalEnd(v verdict, resp *Response, cause error, committing bool) (Decision, error) {
	e := a.e
	ctx := a.storeCtx()
	e.cfg.logger.WarnContext(ctx, "idempotency: the leased attempt's transaction of local writes ended before the engine committed it; settling from the record",
		slog.String("id", a.id.String()), slog.Int("status", resp.Status), slog.Bool("effect", a.effect()), slog.String("error", cause.Error()))
	rec, err := e.store.Get(ctx, a.id, e.cfg.clock())
	switch {
	case err == nil && rec.Token == a.token && rec.State != StateInProgress:
		return a.committed(rec)
	case err == nil && rec.Token != a.token, errors.Is(err, ErrNotFound):
		return DecisionLeaseLost, &RetryError{Err: ErrLeaseLost, RetryAfter: e.cfg.retryAfter}
	case err != nil:
		if v == vIndeterminate || a.effect() || !committing {
			return DecisionStoreError, &RetryError{Err: fmt.Errorf("%w: %w", ErrOutcomePending, errors.Join(cause, err)), RetryAfter: e.cfg.retryAfter}
		}
		return DecisionStoreError, &RetryError{Err: storeErr(errors.Join(cause, err)), RetryAfter: e.cfg.retryAfter}
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
		return DecisionReleased, &RetryError{Err: storeErr(cause), RetryAfter: e.cfg.retryAfter}
	}
	c := Completion{State: StateCompleted, Status: resp.Status, ExpiresAt: a.completionExpiry()}
	decision := DecisionExecuted
	if v == vIndeterminate {
		c.State, decision = StateIndeterminate, DecisionIndeterminate
	}
	c.Response, err = e.sealInto(nil, a.id, resp, allow)
	if err == nil {
		err = e.store.Complete(ctx, a.id, a.token, c)
	}
	switch {
	case errors.Is(err, ErrFenced):
		return DecisionLeaseLost, &RetryError{Err: ErrLeaseLost, RetryAfter: e.cfg.retryAfter}
	case err != nil:
		return DecisionStoreError, &RetryError{Err: fmt.Errorf("%w: %w", ErrOutcomePending, err), RetryAfter: e.cfg.retryAfter}
	}
	return decision, replaced
}
