// Package core is the framework-agnostic idempotency state machine of idem:
// Idempotency-Key support that makes HTTP APIs and message consumers safe to
// retry. It depends on the standard library only; the adapters (ginidem,
// echoidem, chiidem) and the SQL stores (gormstore, sqlstore) are thin
// layers over it.
//
// # The contract in one paragraph
//
// A record is identified by (caller, scope, key): the caller comes from a
// WithCaller function (or WithSingleCaller says there is only one), the scope is
// empty unless a route names one with Scope (it never comes from the
// router: not the route pattern, not the path, not the method), the key is
// the client's Idempotency-Key header in raw or RFC 8941 quoted form. So a
// key is unique within its caller, whatever the route or the router. The
// first request runs the handler and records its response; a duplicate
// gets the recorded status, body and allowlisted headers with
// Idempotent-Replayed: true; a different request under the same key (a
// different body, query, method or concrete path: another route too) gets
// 422; a duplicate of a request still running gets 409 with Retry-After
// (or waits, WaitInFlight); when the running request's lease is no longer
// being extended (its process died), Retry-After says when the lease
// lapses and a retry can take over. The route pattern the adapter knows
// labels the decisions (observe.Event.Route) and is never part of the identity.
// Before MarkEffect, 400 and 422 (validation failures), 408, 429, Release,
// panics and 5xx release the record; after it nothing does: a 5xx, 408,
// 429 or a panic leaves it indeterminate (replayed until a Resolver settles
// it), any other answer is recorded. However the transaction ends (a
// failed or unknown COMMIT, a killed session, the handler's own Commit or
// Rollback), the engine settles the attempt from the record, so a marked
// effect never runs again because a commit failed. Records expire after the retention window
// (DefaultRetention, 24 hours); a Sweeper deletes them.
//
// # The state machine
//
// A record is absent (never claimed, released, or expired), in progress
// (an attempt holds it: by a lease in leased mode, by its transaction in
// atomic mode), completed or indeterminate. What each event does to it,
// and what the request gets (Route.Serve for HTTP; Engine.Once is the same
// machine, with fn's nil error as a 200 and any error as a 500):
//
//	state          event                                    next state     answer
//	absent         request                                  in progress    the handler runs (attempt 1)
//	in progress    request, held                            in progress    409 + Retry-After (WaitInFlight: poll until the bound first; a lease under half its length: until it lapses)
//	in progress    request, lease lapsed (default)         in progress    the handler runs again (attempt n+1; the old token is fenced)
//	in progress    request, lease lapsed (WithoutTakeover) indeterminate  as for indeterminate
//	completed      request                                  completed      the recorded response, Idempotent-Replayed: true
//	indeterminate  request, no Resolver, OutcomeUnresolved  indeterminate  the recorded 5xx, replayed
//	indeterminate  request, Resolver: OutcomeApplied        completed      the resolver's response, replayed
//	indeterminate  request, Resolver: OutcomeNotApplied     absent         claimed again: the handler runs
//	any but absent request, other fingerprint (other route) unchanged      422
//	in progress    handler answers 2xx-4xx (see below)      completed      the handler's answer
//	in progress    before MarkEffect: 400, 408, 422, 429,   absent         the handler's answer (a panic: 500)
//	               5xx, panic, or Release
//	in progress    after MarkEffect: 5xx, 408, 429, panic   indeterminate  the handler's answer (a panic: 500)
//	in progress    handler ends, lease lost (fenced)        the new owner's 409 (ErrLeaseLost)
//	in progress    transaction ends but by our commit       read back      committed: the handler's answer; else as
//	               (attempt.afterEnd, afterLocalEnd)                       above, a success whose writes are gone:
//	                                                                       indeterminate after MarkEffect, else 503
//	                                                                       (a claim gone from the open transaction:
//	                                                                       indeterminate)
//	in progress    MarkEffect meets an earlier attempt's    indeterminate  500 outcome-unknown, its writes rolled back
//	               effect guard (atomic mode, guardEffect)
//
// Where it is in the code: all of it is in machine.go. Route.acquire
// takes the request rows (claim, wait, takeover, fingerprint comparison),
// Route.resolve the indeterminate ones, attempt.classify maps how the
// handler ended to a verdict, and attempt.finish records it (commit or
// rollback in atomic mode; afterEnd, afterAbort and afterLocalEnd when
// the transaction ended other than by the engine's commit). One entry and
// one exit: every driver (Route.Serve, Route.Within, Route.Exec,
// Engine.Once) reads its transport into a job, Route.enter claims and
// runs the handler (its context, the heartbeat, recover, end), and
// Route.exit answers (a lost race as the duplicate it was), has the
// driver write the answer and emits the event.
//
// # Two modes
//
// Atomic mode (stores that implement store.TxStore): the claim, the handler's
// business writes and the recorded response commit in one database
// transaction, which the handler reaches from its request context through
// the store (sqlstore.Tx, gormstore.DB). The client gets the response
// only after the commit (past the recording cap the rest of the answer
// waits in a temporary file until the commit, and the record says its body
// was not kept); a client that goes away does not end the
// attempt: its claim holds until the handler ends, and the retry gets its
// answer. Leased mode (any store, or the Leased route option): the claim
// commits first with a lease that a heartbeat extends, on its own
// connection whatever transaction the request's context carries
// (store.TxStore.WithoutTx); the attempt outlives its client (its context ends
// only when the lease is lost); completion is fenced by a token, so an
// attempt that lost its lease to a takeover cannot overwrite the new
// owner's record. DownstreamKey gives a deterministic key to pass to
// external APIs so a takeover repeats their calls safely.
//
// # Using it
//
//	e, err := core.New(store, core.WithCaller(func(r *http.Request) (string, error) {
//		return accountFrom(r.Context()), nil
//	}))
//	mux.Handle("POST /orders", e.Handler(createOrder))
//
// Adapters for Gin, Echo and chi call Route.Serve (and Route.ServeWithin
// for their Within); adapters of other transports (grpcidem) call
// Route.Exec. Message consumers call
// Engine.Once. A service that opens the transaction itself calls
// Route.Within from its handler with a TxFunc (its own BeginTx/Commit,
// GORM's db.Transaction, a service layer's InTx): the claim, the handler
// and the completion run in that transaction, and the answer is written
// after the commit:
//
//	route := e.Route()
//	mux.HandleFunc("POST /payments", func(w http.ResponseWriter, r *http.Request) {
//		route.Within(w, r, svc.InTx, createPayment)
//	})
//
// Every rejection is an RFC 9457 problem document (see Problem) and maps
// to a sentinel error in errors.go.
//
// # Operating it
//
// An operator answers "which requests are stuck, and why?" with
// Engine.Records (the records of a state, oldest first, each with a
// sentence saying what it means) and Engine.Record (one record, by the
// record_id a client quotes, with its recorded response), and settles a
// record whose outcome is unknown with Engine.ResolveRecord (applied,
// with the answer retries get; or not applied) or Engine.ReleaseRecord,
// fenced like any attempt and logged with the operator's reason. The
// store must implement store.Inspector to list. Engine.AdminHandler serves the
// same over JSON for an admin router (mount it behind your own
// authentication); the idemctl command does it on a DSN.
//
// # Packages beside core
//
// Package core holds what an application calls. What others implement,
// and the documents it hands out, are packages of their own, which core
// imports and which import nothing of core: core/store is the store SPI
// (Store, TxStore, Record, ID; a Resolver reads a store.Record),
// core/observe what an Observer (WithObserver) is given, core/admin the
// operator's documents (Engine.Records returns an admin.Page), and
// core/seal the Sealer (WithSealer) with its AES-GCM implementation.
//
// Engine options return an error from New when invalid; route options
// (Scope, Retention, WaitInFlight, Leased, Fingerprint, KeyOptional,
// Methods) panic when created with invalid arguments, like
// regexp.MustCompile, because they are fixed at start-up.
//
// The decisions this package takes where the contract is silent are listed
// in docs/decisions.md of the repository.
package core
