package scenario

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/store"
)

// withinScenarios is the suite RunWithin runs: the rules of Route.Serve
// that apply to a service that owns its transaction (Route.Within), and
// the rules of that path: the answer leaves after the commit, and a
// commit that fails records nothing.
var withinScenarios = []scenario{
	{"FirstRequestRuns", "The first request with a key runs the handler, which reads the whole request body, and its answer reaches the client unchanged, without Idempotent-Replayed.", atomicMode, testFirstRuns},
	{"ReplaysRecordedAnswer", "A duplicate (same caller, scope, key and body) gets the recorded status, body and recorded headers plus Idempotent-Replayed: true, and the handler does not run again.", atomicMode, testReplay},
	{"RecordedStatuses", "Every answer below 500 except 400, 408, 422 and 429 before an effect completes the record, and a duplicate replays it.", atomicMode, testRecordedStatuses},
	{"BadKeys", "A covered request without a key, or with a malformed one, gets a 400 problem document (missing-key or invalid-key) and the handler does not run.", atomicMode, testBadKeys},
	{"NoCaller", "A covered request whose caller cannot be identified gets a 401 unauthenticated problem document and the handler does not run.", atomicMode, testNoCaller},
	{"BodyMismatch", "A request under a used key with a different body gets a 422 key-reused problem document: nothing runs, nothing is replayed, and the record is unchanged.", atomicMode, testMismatch},
	{"ScopeEmptyByDefault", "Without a Scope option the scope is empty, never the route pattern or the path: requests to /orders/1/refunds and /orders/2/refunds with the same key address one record, and the second gets a 422 from it.", atomicMode, testScopeEmptyByDefault},
	{"KeyOnAnotherRoute", "The same key sent to POST /orders and then to POST /orders/1/cancel is a key reused for another request: a 422, and the cancel does not run.", atomicMode, testKeyOnAnotherRoute},
	{"OtherResource", "The same key, caller and body sent to /orders/1/payments and then to /orders/2/payments gets a 422, never order 1's answer; the handler runs once.", atomicMode, testOtherResource},
	{"InFlightConflict", "A duplicate of a request whose transaction is still open gets a 409 in-progress problem document with Retry-After at once, and the handler does not run again.", atomicMode, testInFlightReject},
	{"ConcurrentDuplicates", "Of 50 concurrent identical requests over TCP exactly one runs the handler; every other gets its 201 replayed or a 409 in-progress.", atomicMode, testConcurrent},
	{"ReleaseStatuses", "A 400 or 422 (a validation failure: execution never began) or a 408 or 429 answered before core.MarkEffect releases the record, so the corrected request or a retry with the same key runs the handler again.", atomicMode, testReleaseStatuses},
	{"AfterEffectNothingReleased", "After core.MarkEffect nothing releases the record: a 400 or 422 is recorded and replayed, a 408 or 429 is indeterminate and replayed, core.Release fails with ErrConfig; the handler does not run again.", atomicMode, testAfterEffectKept},
	{"ExplicitRelease", "A handler that calls core.Release gets its answer delivered, and the record is released, so a retry runs again even after a 400.", atomicMode, testExplicitRelease},
	{"PanicReleases", "A panicking handler releases the record (its transaction rolls back) and its panic propagates to the outer recovery; a retry runs again.", atomicMode, testPanicReleases},
	{"ServerErrorBeforeEffectReleases", "A 5xx with no external effect marked reaches the client and releases the record (the transaction rolls back), so a retry runs again.", atomicMode, test5xxBeforeEffectReleases},
	{"ServerErrorAfterEffectIndeterminate", "A 5xx after core.MarkEffect leaves the record indeterminate: a retry replays the recorded 5xx with Idempotent-Replayed and the handler does not run.", atomicMode, testEffect5xxIndeterminate},
	{"ProblemBaseAndWriter", "Every rejection (400, 401, 422) is written by the engine's error writer (WithErrorWriter) with types under its problem base (WithProblemBase).", atomicMode, testProblemShape},
	{"HandlerContext", "The handler's request context carries the attempt (AttemptFrom: identity, attempt 1, atomic), a downstream key and the service's transaction.", atomicMode, testHandlerContext},
	{"AnswerAfterCommit", "The client gets the handler's answer only after the service's transaction committed: no header and no byte before.", atomicMode, testWithinAnswerAfterCommit},
	{"CommitFailsRecordsNothing", "When the service's commit fails, the client gets a 503 store-unavailable problem with Retry-After and nothing of the handler's answer, nothing is recorded, and the retry runs the handler again.", atomicMode, testWithinCommitFails},
	{"CommitFailsAfterEffect", "When the service's commit fails after the handler marked an external effect and answered 201, the outcome is recorded as indeterminate in a transaction of the engine's own: the client gets a 500 outcome-unknown problem, never the 201, and a retry replays it without running the handler (it cannot know whether the effect happened).", atomicMode, testWithinCommitFailsAfterEffect},
	{"TxFuncFailsAfterBody", "When the service's TxFunc fails after the handler answered (its own work after body, then a rollback), the client gets a 503 problem, not the handler's answer, and the retry runs.", atomicMode, testWithinServiceFails},
}

// RunWithin runs the scenarios of core.Route.Within, the HTTP path of a
// service that owns its transaction, in atomic mode (memstore.Atomic). f
// must serve each route with Route.Within, with a TxFunc that opens the
// transaction the service would (StoreTx gives one over the engine's
// store): the handler is the route's Handler.
func RunWithin(t *testing.T, f Factory, opts ...Option) {
	t.Helper()
	if f == nil {
		t.Fatal("scenario.RunWithin: nil Factory")
	}
	run(t, withinScenarios, builder(f), false, opts)
}

// StoreTx is the TxFunc of a service whose transactions are the engine's
// store's own (store.TxStore.Begin): it begins one, runs body with it, and
// rolls back when body fails, else commits.
func StoreTx(e *core.Engine) core.TxFunc {
	ts, ok := e.Store().(store.TxStore)
	if !ok {
		panic(fmt.Sprintf("scenario.StoreTx: the engine's store (%T) has no transactions", e.Store()))
	}
	return func(ctx context.Context, body func(context.Context) error) error {
		ctx, tx, err := ts.Begin(ctx)
		if err != nil {
			return err
		}
		committed := false
		defer func() {
			if !committed {
				_ = tx.Rollback() // body failed or panicked
			}
		}()
		if err := body(ctx); err != nil {
			return err
		}
		committed = true
		return tx.Commit()
	}
}

// commitOrder wraps the router under test: the client's writer fails
// the scenario when a status or a byte is written before the store saw
// one more commit than it had when the request came in.
type commitOrder struct {
	http.ResponseWriter
	t      *testing.T
	x      *harness
	before int32
}

func (w *commitOrder) check() {
	if w.x.hooks.commits.Load() <= w.before {
		w.t.Error("the answer is written before the service's transaction committed")
	}
}
func (w *commitOrder) WriteHeader(code int)        { w.check(); w.ResponseWriter.WriteHeader(code) }
func (w *commitOrder) Write(p []byte) (int, error) { w.check(); return w.ResponseWriter.Write(p) }

func testWithinAnswerAfterCommit(t *testing.T, x *harness) {
	var n atomic.Int32
	x.start(nil, orders(&n))
	inner := x.h
	x.h = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		inner.ServeHTTP(&commitOrder{ResponseWriter: w, t: t, x: x, before: x.hooks.commits.Load()}, r)
	})
	first := x.do(post("/orders", orderJSON, "k1"))
	wantOriginal(t, first, http.StatusCreated, orderBody(1, "alice", orderJSON))
	if got := x.hooks.commits.Load(); got != 1 {
		t.Errorf("%d commits, want 1", got)
	}
	x.h = inner
	wantReplay(t, first, x.do(post("/orders", orderJSON, "k1")))
	wantCalls(t, &n, 1)
}

func testWithinCommitFails(t *testing.T, x *harness) {
	var n atomic.Int32
	x.start(nil, orders(&n))
	x.hooks.failing.Store(opCommit)
	res := x.do(post("/orders", orderJSON, "k1"))
	wantProblem(t, res, http.StatusServiceUnavailable, "store-unavailable")
	wantRetryAfter(t, res)
	if strings.Contains(res.Body, "order") || res.Header.Get("Location") != "" {
		t.Errorf("the client got part of the handler's answer with the 503: %v", res)
	}
	if _, err := x.records.Get(context.Background(), store.Identity{Caller: "alice", Key: "k1"}.ID(), x.clock.Now()); err == nil {
		t.Error("a record exists after the failed commit")
	}
	x.hooks.failing.Store(0)
	retry := x.do(post("/orders", orderJSON, "k1"))
	wantOriginal(t, retry, http.StatusCreated, orderBody(2, "alice", orderJSON))
	wantReplay(t, retry, x.do(post("/orders", orderJSON, "k1")))
	wantCalls(t, &n, 2)
}

func testWithinServiceFails(t *testing.T, x *harness) {
	var n atomic.Int32
	var fail atomic.Bool
	fail.Store(true)
	x.start(nil, orders(&n))
	// The service's own work after body fails: it rolls back.
	tx := StoreTx(x.engine)
	x.h = x.recoverer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		x.engine.Route().Within(w, r, func(ctx context.Context, body func(context.Context) error) error {
			return tx(ctx, func(ctx context.Context) error {
				if err := body(ctx); err != nil {
					return err
				}
				if fail.Load() {
					return fmt.Errorf("ledger: posting failed")
				}
				return nil
			})
		}, orders(&n).Handler)
	}))
	res := x.do(post("/orders", orderJSON, "k1"))
	wantProblem(t, res, http.StatusServiceUnavailable, "store-unavailable")
	if strings.Contains(res.Body, "ledger") {
		t.Errorf("the service's error reached the client: %v", res)
	}
	fail.Store(false)
	retry := x.do(post("/orders", orderJSON, "k1"))
	wantOriginal(t, retry, http.StatusCreated, orderBody(2, "alice", orderJSON))
	wantCalls(t, &n, 2)
}

// orders is the route of orderHandler at POST /orders.
func orders(n *atomic.Int32) Route {
	return Route{Method: "POST", Pattern: "/orders", Handler: orderHandler(n)}
}

func testWithinCommitFailsAfterEffect(t *testing.T, x *harness) {
	var n atomic.Int32
	x.start(nil, Route{Method: "POST", Pattern: "/orders", Handler: func(w http.ResponseWriter, r *http.Request) {
		if err := core.MarkEffect(r.Context()); err != nil {
			t.Errorf("MarkEffect: %v", err)
		}
		orderHandler(&n)(w, r) // the charge went out
	}})
	x.hooks.once.Store(opCommit) // the service's commit; the engine's own transaction then commits
	res := x.do(post("/orders", orderJSON, "k1"))
	wantProblem(t, res, http.StatusInternalServerError, "outcome-unknown")
	if strings.Contains(res.Body, "order") {
		t.Errorf("the client got the handler's answer: %v", res)
	}
	retry := x.do(post("/orders", orderJSON, "k1"))
	wantProblem(t, retry, http.StatusInternalServerError, "outcome-unknown")
	if !retry.replayed() {
		t.Errorf("the retry is not a replay: %v", retry)
	}
	wantCalls(t, &n, 1)
}
