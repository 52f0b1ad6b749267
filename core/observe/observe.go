// Package observe is what the engine reports of its decisions: an
// Observer (core.WithObserver) receives an Event for every request,
// message, settlement and operator action, as grpc's stats.Handler does
// for RPCs. otelidem is one; a service's own metrics or audit log can be
// another. The engine logs the same events itself (core.WithLogger).
package observe

import (
	"context"
	"time"

	"github.com/idemkit/idem/core/store"
)

// Decision is what the engine decided for one request or message.
type Decision string

// Decisions reported to the Observer and to the engine's logger.
const (
	DecisionExecuted      Decision = "executed"      // the handler ran and its outcome was recorded
	DecisionReplayed      Decision = "replayed"      // the recorded response was returned
	DecisionRejectedBusy  Decision = "in_progress"   // an in-flight duplicate was refused (409) or declined
	DecisionMismatch      Decision = "mismatch"      // same key, different fingerprint (422)
	DecisionReleased      Decision = "released"      // the handler ran and the record was released (408, 429, release, panic, 5xx before MarkEffect)
	DecisionIndeterminate Decision = "indeterminate" // the handler ran, may have had an effect, and failed: recorded as indeterminate
	DecisionResolved      Decision = "resolved"      // the core.Resolver settled an indeterminate record
	DecisionLeaseLost     Decision = "lease_lost"    // the attempt lost its lease; its completion was refused
	DecisionStoreError    Decision = "store_error"   // the store failed (503, or the handler ran unprotected with WithFailOpen)
	DecisionInvalid       Decision = "invalid"       // the request was refused before any lookup (400, 401, 413)

	// Decisions of the core.Completer, without a client (Event.Route is the
	// route's core.Name).
	DecisionSettled        Decision = "settled"         // the resolver's answer (applied) was recorded
	DecisionSettleReleased Decision = "settle_released" // the resolver said not applied: the record was released
	DecisionFinished       Decision = "finished"        // the finisher ran the recorded request again (Event.Status: its answer)
	DecisionLeft           Decision = "left"            // the attempt ceiling was reached: the record is left for the operator
	DecisionSettleError    Decision = "settle_error"    // the resolver or the store failed; retried after the backoff

	// Decisions of an operator (core.Engine.ResolveRecord, Engine.ReleaseRecord;
	// Event.Err when refused). They are logged by the action's own line.
	DecisionOperatorResolved Decision = "operator_resolved" // resolved as applied
	DecisionOperatorReleased Decision = "operator_released" // released, or resolved as not applied
)

// Event describes one decision.
type Event struct {
	Decision Decision
	ID       store.ID
	Caller   string
	// Scope is the record's scope: the route's core.Scope option (or
	// Engine.Once's consumer), "" by default.
	Scope string
	// Route labels the decision with the route the request reached, for
	// observability only: the router's route pattern ("/orders/:id",
	// "/orders/{id}"; gRPC: the full method name), "" when the adapter
	// does not know it. It is never the concrete path, so it stays
	// bounded, and never part of the identity.
	Route string
	// Key is the idempotency key, or the first 16 hex digits of its SHA-256
	// unless core.WithRawKeysInLogs is set.
	Key      string
	Status   int           // HTTP status sent to the client (0 for Once; Route.Exec: the HTTP equivalent)
	Attempt  int           // attempt number of the record (takeovers increment it)
	Duration time.Duration // from the start of the request to the decision
	Err      error         // the error behind a rejection or failure
	// Claim is how long the claim took: the store's answer, with the
	// transaction's BEGIN in atomic mode and the wait of core.WaitInFlight (0
	// for a request refused before it).
	Claim time.Duration
	// Complete is how long recording the outcome took: the completion or
	// release, with the COMMIT or ROLLBACK in atomic mode (0 when the
	// handler did not run).
	Complete time.Duration
}

// Observer receives every decision the engine takes; see Event.
type Observer func(ctx context.Context, ev Event)
