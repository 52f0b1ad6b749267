package core

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/idemkit/idem/core/admin"
	"github.com/idemkit/idem/core/observe"
	"github.com/idemkit/idem/core/store"
)

// An operator's view: which records are stuck, and why, and how to settle
// them without SQL (docs/contract.md, section 5 "Recovery without a
// client"). Engine.Records and Engine.Record read; Engine.ResolveRecord
// and Engine.ReleaseRecord act, fenced like any attempt. idemctl and
// Engine.AdminHandler are built on these four.

// Records lists the live records in q.State, oldest first (by creation,
// then ID), one page at a time. The store must implement Inspector
// (memstore, sqlstore, gormstore, pgxstore and redisstore do); otherwise it fails with
// an error wrapping ErrConfig, as it does for an invalid query or cursor.
// A listing carries no responses: Record reads one record whole.
func (e *Engine) Records(ctx context.Context, q admin.Query) (admin.Page, error) {
	is, ok := e.store.(store.Inspector)
	if !ok {
		return admin.Page{}, fmt.Errorf("%w: the store (%T) cannot list records: it does not implement store.Inspector", ErrConfig, e.store)
	}
	after, err := store.ParseCursor(q.After)
	if err != nil {
		return admin.Page{}, err
	}
	if q.State == 0 {
		q.State = store.StateIndeterminate
	}
	if q.Limit == 0 {
		q.Limit = DefaultRecordsLimit
	}
	now := e.cfg.clock()
	lq := store.ListQuery{State: q.State, Now: now, After: after, Limit: q.Limit}
	if q.OlderThan > 0 {
		lq.CreatedBefore = now.Add(-q.OlderThan)
	}
	recs, err := is.List(e.adminCtx(ctx), lq)
	if err != nil {
		if errors.Is(err, ErrConfig) {
			return admin.Page{}, err
		}
		return admin.Page{}, storeErr(err)
	}
	page := admin.Page{Records: make([]admin.Record, 0, len(recs))}
	for _, rec := range recs {
		if rec.Scope == guardScope {
			continue // an effect guard (MarkEffect), not a request's record
		}
		page.Records = append(page.Records, e.info(rec, now, false))
	}
	if len(recs) == lq.Limit {
		page.Next = store.CursorOf(recs[len(recs)-1]).String()
	}
	return page, nil
}

// Record returns the live record id with its recorded response, or an
// error wrapping ErrNotFound (never claimed, released, or expired).
func (e *Engine) Record(ctx context.Context, id store.ID) (admin.Record, error) {
	now := e.cfg.clock()
	rec, err := e.store.Get(e.adminCtx(ctx), id, now)
	if err != nil {
		return admin.Record{}, e.getErr(id, err)
	}
	return e.info(rec, now, true), nil
}

// ResolveRecord settles, as an operator, a record whose outcome is
// unknown: an indeterminate record, or one in progress whose lease lapsed
// (its attempt stopped without recording an outcome). reason, which must
// not be empty, is logged with the record's ID.
//
//   - res.Outcome OutcomeApplied: the effect happened; the record is
//     completed with res.Response (required, status 200 to 599, its body
//     recorded whole and sealed with the engine's Sealer; only the
//     engine's recorded headers are kept), which every retry then gets,
//     for the engine's retention (Retention's default, DefaultRetention).
//     The completed record is returned.
//   - res.Outcome OutcomeNotApplied: nothing happened; the record is
//     released (as ReleaseRecord), so the next retry runs the handler.
//     The zero admin.Record is returned.
//
// The action is fenced like any attempt: an indeterminate record is
// settled with the token it was read with, and an in-progress record is
// first taken over (a new token, Attempt+1), so its old attempt, should
// it still be alive, can no longer record anything (its completion gets
// ErrLeaseLost). It never overwrites what another attempt or settler
// recorded: if the record changed since it was read (a retry took the
// lapsed lease over, a resolver settled it), the error wraps ErrFenced
// and says what the record is now. Other refusals: ErrNotFound (no live
// record), ErrInProgress (a live lease: an attempt is running and records
// its own outcome), ErrFenced (completed: a recorded answer is final),
// ErrConfig (no reason, an outcome other than the two, a missing or
// invalid response); a store failure wraps ErrStoreUnavailable.
//
// Every action, done or refused, is logged at info level on the engine's
// logger (WithLogger) as "idempotency: operator action", with the record's
// id, the action, the reason and the result.
func (e *Engine) ResolveRecord(ctx context.Context, id store.ID, res Resolution, reason string) (admin.Record, error) {
	switch res.Outcome {
	case OutcomeApplied:
		if res.Response == nil {
			return admin.Record{}, e.refused(ctx, id, "resolve_applied", reason, fmt.Errorf("%w: resolving a record as applied needs the response retries are to get", ErrConfig))
		}
		resp := *res.Response
		resp.BodyKept = true
		if resp.Status < 200 || resp.Status > 599 {
			return admin.Record{}, e.refused(ctx, id, "resolve_applied", reason, fmt.Errorf("%w: the response's status %d is not 200 to 599", ErrConfig, resp.Status))
		}
		if int64(len(resp.Body)) > e.cfg.maxResponse {
			return admin.Record{}, e.refused(ctx, id, "resolve_applied", reason, fmt.Errorf("%w: the response's body of %d bytes is over the recording cap of %d (WithMaxResponseBody)", ErrConfig, len(resp.Body), e.cfg.maxResponse))
		}
		return e.settleRecord(ctx, id, "resolve_applied", reason, &resp)
	case OutcomeNotApplied:
		return e.settleRecord(ctx, id, "resolve_not_applied", reason, nil)
	}
	return admin.Record{}, e.refused(ctx, id, "resolve", reason, fmt.Errorf("%w: an operator resolves a record as applied or not applied (outcome %d)", ErrConfig, res.Outcome))
}

// ReleaseRecord deletes, as an operator, a record whose outcome is
// unknown (indeterminate, or in progress with a lapsed lease), so the
// next retry with its key runs the handler again: use it when nothing
// happened, or when the handler's external calls are safe to repeat
// (downstream keys). It is fenced and logged as ResolveRecord is, and
// refuses what ResolveRecord refuses.
func (e *Engine) ReleaseRecord(ctx context.Context, id store.ID, reason string) error {
	_, err := e.settleRecord(ctx, id, "release", reason, nil)
	return err
}

// settleRecord is ResolveRecord's and ReleaseRecord's work: complete the
// record with resp, or release it (resp nil).
func (e *Engine) settleRecord(ctx context.Context, id store.ID, action, reason string, resp *Response) (admin.Record, error) {
	began := e.cfg.clock()
	if strings.TrimSpace(reason) == "" {
		return admin.Record{}, e.refused(ctx, id, action, reason, fmt.Errorf("%w: give the reason for the action: it is logged with the record", ErrConfig))
	}
	sctx := e.adminCtx(ctx)
	now := e.cfg.clock()
	rec, err := e.store.Get(sctx, id, now)
	if err != nil {
		return admin.Record{}, e.refused(ctx, id, action, reason, e.getErr(id, err))
	}
	was := rec
	switch rec.State {
	case store.StateCompleted:
		return admin.Record{}, e.refused(ctx, id, action, reason, fmt.Errorf("%w: the record is completed (status %d): a recorded answer is final", ErrFenced, rec.Status))
	case store.StateInProgress:
		if rec.LeaseUntil.IsZero() || rec.LeaseUntil.After(now) {
			return admin.Record{}, e.refused(ctx, id, action, reason, fmt.Errorf("%w: attempt %d holds the record (%s): it records its own outcome; act once its lease has lapsed",
				ErrInProgress, rec.Attempt, leaseText(rec, now)))
		}
		// Take the lapsed lease over, as a retry would: the old attempt,
		// if it is still alive, is fenced from now on.
		req := store.ClaimRequest{ID: id, Caller: rec.Caller, Scope: rec.Scope, Key: rec.Key, Fingerprint: rec.Fingerprint,
			Token: newToken(), Now: now, LeaseUntil: now.Add(e.cfg.lease), ExpiresAt: rec.ExpiresAt, Takeover: true}
		if req.ExpiresAt.Before(req.LeaseUntil) {
			req.ExpiresAt = req.LeaseUntil
		}
		cr, err := e.store.Claim(sctx, req)
		if err != nil {
			return admin.Record{}, e.refused(ctx, id, action, reason, storeErr(err))
		}
		if !cr.Claimed {
			return admin.Record{}, e.refused(ctx, id, action, reason, e.changed(sctx, id, was))
		}
		rec = cr.Record
		rec.Token = req.Token
	}
	// From here the action completes even if the caller goes away: a
	// takeover left behind would hold the record until its lease lapses.
	wctx := context.WithoutCancel(sctx)
	if resp == nil {
		err = e.store.Release(wctx, id, rec.Token)
		if err == nil {
			err = e.releaseGuard(wctx, id) // the next attempt may mark its effect again
		}
	} else {
		var blob []byte
		blob, err = e.sealResponse(id, resp, e.cfg.recorded)
		if err == nil {
			err = e.store.Complete(wctx, id, rec.Token, store.Completion{State: store.StateCompleted, Status: resp.Status,
				Response: blob, ExpiresAt: now.Add(e.cfg.policy.retention)})
		}
	}
	switch {
	case errors.Is(err, ErrFenced):
		return admin.Record{}, e.refused(ctx, id, action, reason, e.changed(wctx, id, was))
	case err != nil:
		if was.State == store.StateInProgress {
			err = fmt.Errorf("%w (the record stays in progress under the operator's takeover until its lease lapses at %s)", err, rec.LeaseUntil.UTC().Format(time.RFC3339))
		}
		return admin.Record{}, e.refused(ctx, id, action, reason, storeErr(err))
	}
	e.logAction(ctx, was, action, reason, nil, e.cfg.clock().Sub(began))
	if resp == nil {
		return admin.Record{}, nil
	}
	got, err := e.store.Get(wctx, id, e.cfg.clock())
	if err != nil {
		return admin.Record{}, fmt.Errorf("the record was completed, but reading it back failed: %w", e.getErr(id, err))
	}
	return e.info(got, e.cfg.clock(), true), nil
}

// changed is the error of an action whose record changed since it was
// read (was): it wraps ErrFenced and says what the record is now.
func (e *Engine) changed(ctx context.Context, id store.ID, was store.Record) error {
	const lead = "the record changed since it was read"
	now, err := e.store.Get(ctx, id, e.cfg.clock())
	switch {
	case errors.Is(err, ErrNotFound):
		return fmt.Errorf("%w: %s: it is gone (released by another settler, or expired); nothing was changed", ErrFenced, lead)
	case err != nil:
		return fmt.Errorf("%w: %s (reading it again failed: %v); nothing was changed", ErrFenced, lead, err)
	case now.State == store.StateCompleted:
		return fmt.Errorf("%w: %s: another attempt or settler completed it (status %d); nothing was changed", ErrFenced, lead, now.Status)
	case now.Attempt != was.Attempt || now.Token != was.Token:
		return fmt.Errorf("%w: %s: attempt %d holds it now (%s); nothing was changed", ErrFenced, lead, now.Attempt, now.State)
	}
	return fmt.Errorf("%w: %s (it is %s); nothing was changed", ErrFenced, lead, now.State)
}

// refused logs an action that was refused and returns err.
func (e *Engine) refused(ctx context.Context, id store.ID, action, reason string, err error) error {
	e.logAction(ctx, store.Record{ID: id}, action, reason, err, 0)
	return err
}

// logAction writes the log line of an operator's action on rec (as read
// before the action), and reports it to the Observer with how long it
// took (d; 0 for a refusal).
func (e *Engine) logAction(ctx context.Context, rec store.Record, action, reason string, err error, d time.Duration) {
	attrs := []slog.Attr{
		slog.String("id", rec.ID.String()),
		slog.String("action", action),
		slog.String("reason", reason),
	}
	if rec.State != 0 {
		attrs = append(attrs,
			slog.String("state", rec.State.String()),
			slog.String("caller", rec.Caller),
			slog.String("scope", rec.Scope),
			slog.String("key", e.logKey(rec.Key)),
			slog.Int("attempt", rec.Attempt))
	}
	if err != nil {
		attrs = append(attrs, slog.String("result", "refused"), slog.String("error", err.Error()))
	} else {
		attrs = append(attrs, slog.String("result", "done"))
	}
	e.cfg.logger.LogAttrs(ctx, slog.LevelInfo, "idempotency: operator action", attrs...)
	if o := e.cfg.observer; o != nil {
		// The Observer sees every action too (otelidem counts them by
		// decision); this line is its log.
		ev := observe.Event{Decision: observe.DecisionOperatorReleased, ID: rec.ID, Caller: rec.Caller, Scope: rec.Scope,
			Key: e.logKey(rec.Key), Attempt: rec.Attempt, Status: rec.Status, Err: err, Duration: d}
		if action == "resolve_applied" || action == "resolve" {
			ev.Decision = observe.DecisionOperatorResolved
		}
		o(ctx, ev)
	}
}

// getErr is the error of a Get of id for an operator.
func (e *Engine) getErr(id store.ID, err error) error {
	if errors.Is(err, ErrNotFound) {
		return fmt.Errorf("%w: no live record %s (never claimed, released, or expired)", ErrNotFound, id)
	}
	return storeErr(err)
}

// adminCtx is ctx for an operator's store calls: any transaction of the
// store that ctx carries (a transaction-per-request middleware's around
// the admin router) is hidden, so an action commits on its own.
func (e *Engine) adminCtx(ctx context.Context) context.Context {
	if e.tx != nil {
		return e.tx.WithoutTx(ctx)
	}
	return ctx
}

// info is the operator's view of rec at now; withResponse opens the
// recorded response.
func (e *Engine) info(rec store.Record, now time.Time, withResponse bool) admin.Record {
	in := admin.Record{
		ID: rec.ID.String(), State: rec.State.String(),
		Caller: rec.Caller, Scope: rec.Scope, Key: rec.Key,
		Fingerprint: fmt.Sprintf("%x", rec.Fingerprint),
		Attempt:     rec.Attempt,
		CreatedAt:   rec.CreatedAt.UTC(), ExpiresAt: rec.ExpiresAt.UTC(),
		Status: rec.Status,
	}
	if !rec.LeaseUntil.IsZero() && rec.State == store.StateInProgress {
		lu := rec.LeaseUntil.UTC()
		in.LeaseUntil, in.LeaseLapsed = &lu, !lu.After(now)
	}
	if withResponse && rec.State != store.StateInProgress && len(rec.Response) > 0 {
		if r, err := e.openResponse(rec.ID, rec.Response); err != nil {
			in.ResponseError = err.Error()
		} else {
			resp := r.response()
			ri := &admin.Response{Status: resp.Status, Header: resp.Header, BodyKept: resp.BodyKept}
			if utf8.Valid(resp.Body) {
				ri.Body = string(resp.Body)
			} else {
				ri.BodyBase64 = append([]byte(nil), resp.Body...)
			}
			in.Response = ri
		}
	}
	in.Why = e.why(rec, now)
	return in
}

// why says what rec's state means at now and what happens next.
func (e *Engine) why(rec store.Record, now time.Time) string {
	switch rec.State {
	case store.StateCompleted:
		return fmt.Sprintf("completed with %d: every retry with its key gets this answer until it expires (%s)", rec.Status, until(rec.ExpiresAt, now))
	case store.StateIndeterminate:
		return fmt.Sprintf("outcome unknown: attempt %d may have had an external effect (after MarkEffect) and did not end with an answer to record (%d); "+
			"retries get the recorded %d until a resolver or an operator settles it: resolve it as applied (with the answer) or not applied (release)",
			rec.Attempt, rec.Status, rec.Status)
	case store.StateInProgress:
		switch {
		case rec.LeaseUntil.IsZero():
			return fmt.Sprintf("attempt %d is running in a database transaction (atomic mode): it commits its outcome with it, or nothing", rec.Attempt)
		case rec.LeaseUntil.After(now):
			return fmt.Sprintf("attempt %d is running (%s): it records its own outcome", rec.Attempt, leaseText(rec, now))
		}
		next := "the next retry with its key takes it over and runs the handler again (with the same downstream keys)"
		if !e.cfg.takeover {
			next = "the next retry with its key marks it indeterminate (WithoutTakeover)"
		}
		return fmt.Sprintf("stuck: attempt %d stopped without recording an outcome (%s); %s, or an operator resolves or releases it",
			rec.Attempt, leaseText(rec, now), next)
	}
	return "unknown state"
}

// leaseText describes rec's lease at now.
func leaseText(rec store.Record, now time.Time) string {
	lu := rec.LeaseUntil.UTC().Format(time.RFC3339)
	if rec.LeaseUntil.After(now) {
		return fmt.Sprintf("its lease runs until %s, %s from now", lu, rec.LeaseUntil.Sub(now).Round(time.Second))
	}
	return fmt.Sprintf("its lease lapsed at %s, %s ago", lu, now.Sub(rec.LeaseUntil).Round(time.Second))
}

// until describes t relative to now.
func until(t, now time.Time) string {
	return fmt.Sprintf("%s, in %s", t.UTC().Format(time.RFC3339), t.Sub(now).Round(time.Second))
}
