package core

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"

	"github.com/idemkit/idem/core/observe"
	"github.com/idemkit/idem/core/store"
)

// TxFunc runs body in a transaction the service opens itself and returns
// the transaction's result: body's error once the transaction is rolled
// back, else the commit's error (nil: committed). body must be given a
// context that carries the transaction for the route's store
// (sqlstore.WithTx, gormstore.WithTx), and be called once. With GORM:
//
//	func(ctx context.Context, body func(context.Context) error) error {
//		return db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
//			return body(gormstore.WithTx(ctx, tx))
//		})
//	}
//
// With database/sql:
//
//	func(ctx context.Context, body func(context.Context) error) error {
//		tx, err := db.BeginTx(ctx, nil)
//		if err != nil {
//			return err
//		}
//		defer tx.Rollback() // after Commit: does nothing
//		if err := body(sqlstore.WithTx(ctx, tx)); err != nil {
//			return err
//		}
//		return tx.Commit()
//	}
//
// A service whose layer already has such a function (s.InTx(ctx, fn))
// passes it as it is, unless it runs fn again after a failed commit (a
// serialization failure's retry loop): body's second call is refused (500
// not-protected), and the first call's attempt is settled from the record
// as after any failed commit (after MarkEffect: indeterminate), so no
// retry repeats its effect.
type TxFunc func(ctx context.Context, body func(ctx context.Context) error) error

// errReplayed is body's error for a request answered from its record:
// the handler did not run, so the transaction has nothing to commit.
var errReplayed = errors.New("idem: the request was answered from its record without running the handler; roll back")

// errReleased is body's error for a handler whose answer releases the
// record (a 5xx before MarkEffect, 408, 429, core.Release): nothing of it
// may commit.
var errReleased = errors.New("idem: the handler's answer releases the record (5xx before MarkEffect, 408, 429 or core.Release); roll back")

// Within serves r for a service that owns its transaction: the claim of
// the record, handler and the completion of the record run in the
// transaction inTx opens, and w gets the answer only after inTx returned:
//
//	route := engine.Route()
//	mux.HandleFunc("POST /payments", func(w http.ResponseWriter, r *http.Request) {
//		route.Within(w, r, svc.InTx, createPayment)
//	})
//
// handler writes its answer to the http.ResponseWriter it is given, as any
// handler does; its request's context carries the transaction (body's
// context) and the attempt (MarkEffect, Release, DownstreamKey,
// AttemptFrom). The rules are Route.Serve's (docs/contract.md, sections 3
// and 4); what differs is who commits:
//
//   - the handler answered below 500 (except 408, 429), or 5xx after
//     MarkEffect: the record completes in the transaction and body
//     returns nil. w gets the handler's answer if inTx returns nil (the
//     commit succeeded); otherwise nothing was recorded, and w gets the
//     503 transaction-aborted problem (the error wraps ErrTxAborted) or
//     store-unavailable problem (any other error), with Retry-After. After
//     MarkEffect the outcome is then recorded in a transaction of the
//     engine's own, as after an abort (see docs/decisions.md): a 2xx as
//     indeterminate (the client and its retries get 500 outcome-unknown),
//     so a retry does not repeat the effect.
//   - the handler's answer releases the record (5xx before MarkEffect,
//     408, 429, Release, a panic): body returns an error, so the
//     transaction rolls back, and w gets the handler's answer.
//   - a duplicate or a rejection (replay, 409 in-progress, 422 key-reused):
//     the handler does not run, body returns an error (the rejection's
//     sentinel, or one for a replay) so the transaction rolls back, and w
//     gets the replay or the problem document.
//   - a request rejected before the transaction (400 missing-key or
//     invalid-key, 401, 413): inTx is not called.
//
// A request the route does not protect (method not covered, KeyOptional
// without a key) runs handler in inTx too, its answer held until inTx
// returned. Within needs an atomic route (a TxStore: sqlstore,
// gormstore, without Leased); in the transaction, a duplicate of a
// request in flight is answered 409 at once (WaitInFlight does not wait
// inside a transaction). The identity is Route.Serve's: (caller, scope,
// key), the scope the route's Scope option, empty by default; r.Pattern
// (net/http's ServeMux) labels the decisions (Event.Route). Caller
// functions that read a framework's context (NativeFrom: ginidem.Caller,
// echoidem.Caller) find none here: call the adapter's Within
// (ginidem.Within, echoidem.Within), which passes it (ServeWithin). The
// attempt outlives its client: inTx's context keeps r's values but not its
// cancellation, and ends at MaxAttempt.
func (rt *Route) Within(w http.ResponseWriter, r *http.Request, inTx TxFunc, handler http.HandlerFunc) {
	rt.ServeWithin(w, r, "", nil, inTx, handler)
}

// ServeWithin is Within for adapters, as Serve is for their middleware:
// pattern is the router's route pattern (a label for observability only,
// Event.Route; "" when unknown) and native the framework's context, which
// NativeFrom returns to caller functions (nil: none).
func (rt *Route) ServeWithin(w http.ResponseWriter, r *http.Request, pattern string, native any, inTx TxFunc, handler http.HandlerFunc) {
	switch {
	case inTx == nil || handler == nil:
		rt.Refuse(w, r, fmt.Errorf("%w: Route.Within needs a TxFunc and a handler", ErrConfig))
		return
	case !rt.atomic:
		rt.Refuse(w, r, fmt.Errorf("%w: Route.Within needs an atomic route: an engine over a TxStore (sqlstore, gormstore, pgxstore) and a route without Leased; a store without transactions (redisstore) has no atomic mode", ErrConfig))
		return
	}
	c := rt.prepare(w, r, pattern, native, func(w http.ResponseWriter, r *http.Request) { rt.withinUnprotected(w, r, inTx, handler) })
	if c == nil {
		return
	}
	defer c.rec.free()
	ev, j := &c.ev, &job{c: c, owned: true, allow: rt.e.cfg.recorded}
	t := transport{handle: func(ctx context.Context) (*Response, bool, error) { return c.handle(ctx, handler) }, panicked: c.panicked, reply: c.reply}
	var res, first result // first: the first body's, when a second call is refused
	calls := 0            // of body
	// refuse refuses the request of a TxFunc that did not use body as it
	// must (whatever ran before, a second body's first call, is the
	// client's no more: its answer is withheld; exit writes the problem)
	// and returns the error for body to return.
	refuse := func(why string) error {
		err := fmt.Errorf("%w: Route.Within: %s", ErrConfig, why)
		ev.Decision, ev.Err = observe.DecisionInvalid, rt.refused(c.ctx, err)
		res = result{ans: answer{err: ev.Err}}
		return err
	}
	bctx, stop := rt.bounded(context.WithoutCancel(c.ctx))
	defer stop()
	res.txErr = inTx(bctx, func(tctx context.Context) error {
		if calls++; calls == 2 {
			first = res
		}
		if why := rt.misused(calls, tctx); why != "" {
			return refuse(why)
		}
		j.ctx = context.WithValue(tctx, attemptKey{}, c)
		if res = rt.enter(j, t); !res.ran {
			return cmp.Or(res.ans.err, errReplayed) // a rejection, or a replay
		}
		if res.err == nil && ev.Decision == observe.DecisionReleased {
			return errReleased
		}
		return res.err
	})
	c.discarded(first)
	switch {
	case calls == 0 && res.txErr == nil:
		refuse(misusedNotCalled)
	case calls == 0: // the transaction could not begin
		ev.Decision, ev.Err = observe.DecisionStoreError, res.txErr
		res = result{ans: answer{err: storeErr(res.txErr)}}
	}
	rt.exit(j, &res, t)
}

// misused says how the TxFunc misuses body at its call number calls with
// ctx ("": it does not), protected request or not.
func (rt *Route) misused(calls int, ctx context.Context) string {
	switch {
	case calls > 1:
		return "the TxFunc called body twice; call it once, in the transaction"
	case ctx == nil || !rt.e.tx.InTx(ctx):
		return "body's context carries no transaction of the route's store; pass it sqlstore.WithTx(ctx, tx) or gormstore.WithTx(ctx, tx)"
	}
	return ""
}

const misusedNotCalled = "the TxFunc returned without calling body; call it in the transaction"

// withinUnprotected runs handler for a request Within does not protect
// (method not covered, KeyOptional without a key): in inTx too, its
// answer held until inTx returned; a 5xx rolls the transaction back.
func (rt *Route) withinUnprotected(w http.ResponseWriter, r *http.Request, inTx TxFunc, handler http.HandlerFunc) {
	var rec recorder
	rec.init(w, true, rt.e.cfg.maxResponse)
	defer rec.free()
	calls, misuse := 0, ""
	err := inTx(r.Context(), func(ctx context.Context) error {
		calls++
		if misuse = rt.misused(calls, ctx); misuse != "" {
			return fmt.Errorf("%w: Route.Within: %s", ErrConfig, misuse)
		}
		handler(&rec, r.WithContext(ctx))
		if err := rec.settle(); err != nil || rec.status < 500 {
			return err
		}
		return errReleased
	})
	if calls == 0 && err == nil {
		misuse = misusedNotCalled
	}
	if misuse != "" { // the first body's answer, if it ran, is withheld, its header too
		rec.resetHeader()
		rt.Refuse(w, r, fmt.Errorf("%w: Route.Within: %s", ErrConfig, misuse))
		return
	}
	if err == nil || (rec.failed == nil && rec.status >= 500) {
		rec.deliver() // committed, or rolled back for the handler's whole 5xx
		return
	}
	rt.e.cfg.logger.ErrorContext(r.Context(), "idempotency: the transaction of an unprotected request did not commit", slog.String("error", err.Error()))
	if !errors.Is(err, ErrTxAborted) {
		err = storeErr(err)
	}
	rec.resetHeader()
	rt.writeProblem(w, r, err, store.ID{})
}
