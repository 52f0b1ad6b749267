package core

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"log/slog"
	"time"
)

// Decision is what the engine decided for one request or message.
type Decision string

// Decisions reported to the Observer and the logger.
const (
	DecisionExecuted      Decision = "executed"      // the handler ran and its outcome was recorded
	DecisionReplayed      Decision = "replayed"      // the recorded response was returned
	DecisionRejectedBusy  Decision = "in_progress"   // an in-flight duplicate was refused (409) or declined
	DecisionMismatch      Decision = "mismatch"      // same key, different fingerprint (422)
	DecisionReleased      Decision = "released"      // the handler ran and the record was released (408, 429, release, panic, 5xx before MarkEffect)
	DecisionIndeterminate Decision = "indeterminate" // the handler ran, may have had an effect, and failed: recorded as indeterminate
	DecisionResolved      Decision = "resolved"      // the Resolver settled an indeterminate record
	DecisionLeaseLost     Decision = "lease_lost"    // the attempt lost its lease; its completion was refused
	DecisionStoreError    Decision = "store_error"   // the store failed (503, or the handler ran unprotected with WithFailOpen)
	DecisionInvalid       Decision = "invalid"       // the request was refused before any lookup (400, 401, 413)

	// Decisions of the Completer, without a client (Event.Route is the
	// route's Name).
	DecisionSettled        Decision = "settled"         // the resolver's answer (applied) was recorded
	DecisionSettleReleased Decision = "settle_released" // the resolver said not applied: the record was released
	DecisionFinished       Decision = "finished"        // the finisher ran the recorded request again (Event.Status: its answer)
	DecisionLeft           Decision = "left"            // the attempt ceiling was reached: the record is left for the operator
	DecisionSettleError    Decision = "settle_error"    // the resolver or the store failed; retried after the backoff

	// Decisions of an operator (Engine.ResolveRecord, Engine.ReleaseRecord;
	// Event.Err when refused). They are logged by the action's own line.
	DecisionOperatorResolved Decision = "operator_resolved" // resolved as applied
	DecisionOperatorReleased Decision = "operator_released" // released, or resolved as not applied
)

// Event describes one decision.
type Event struct {
	Decision Decision
	ID       ID
	Caller   string
	// Scope is the record's scope: the route's Scope option (or Once's
	// consumer), "" by default.
	Scope string
	// Route labels the decision with the route the request reached, for
	// observability only: the router's route pattern ("/orders/:id",
	// "/orders/{id}"; gRPC: the full method name), "" when the adapter
	// does not know it. It is never the concrete path, so it stays
	// bounded, and never part of the identity.
	Route string
	// Key is the idempotency key, or the first 16 hex digits of its SHA-256
	// unless WithRawKeysInLogs is set.
	Key      string
	Status   int           // HTTP status sent to the client (0 for Once; Exec: the HTTP equivalent)
	Attempt  int           // attempt number of the record (takeovers increment it)
	Duration time.Duration // from the start of the request to the decision
	Err      error         // the error behind a rejection or failure
	// Claim is how long the claim took: the store's answer, with the
	// transaction's BEGIN in atomic mode and the wait of WaitInFlight (0
	// for a request refused before it).
	Claim time.Duration
	// Complete is how long recording the outcome took: the completion or
	// release, with the COMMIT or ROLLBACK in atomic mode (0 when the
	// handler did not run).
	Complete time.Duration
}

// level is the log level of ev: DEBUG for the routine decisions (executed,
// replayed, in progress, mismatch, released, resolved, invalid requests);
// WARN or ERROR only for what an operator must act on: store errors and
// fail-open (ERROR), indeterminate outcomes, lost leases and failing
// caller or fingerprint functions (WARN).
func (ev *Event) level() slog.Level {
	switch ev.Decision {
	case DecisionExecuted, DecisionReplayed, DecisionReleased, DecisionResolved, DecisionRejectedBusy, DecisionMismatch:
		return slog.LevelDebug
	case DecisionSettled, DecisionSettleReleased, DecisionFinished:
		return slog.LevelInfo
	case DecisionLeft, DecisionSettleError:
		return slog.LevelWarn
	case DecisionInvalid:
		var ce *callerError
		var fe *fingerprintError
		if errors.As(ev.Err, &ce) || errors.As(ev.Err, &fe) {
			return slog.LevelWarn
		}
		return slog.LevelDebug
	case DecisionIndeterminate, DecisionLeaseLost:
		return slog.LevelWarn
	}
	return slog.LevelError
}

// logKey is the form of a key that appears in events and logs.
func (e *Engine) logKey(key string) string {
	if e.cfg.logRawKeys || key == "" {
		return key
	}
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:8])
}

// emit reports ev (whose Key is still the raw key) to the observer and the
// logger; the key is hashed only when someone listens.
func (e *Engine) emit(ctx context.Context, ev Event, start time.Time) {
	lvl := ev.level()
	logging := e.cfg.logger.Enabled(ctx, lvl)
	if e.cfg.observer == nil && !logging {
		return // nobody looks: no clock read, no key hashing
	}
	ev.Duration = e.cfg.clock().Sub(start)
	ev.Key = e.logKey(ev.Key)
	if o := e.cfg.observer; o != nil {
		o(ctx, ev)
	}
	if !logging {
		return
	}
	attrs := make([]slog.Attr, 0, 10)
	attrs = append(attrs,
		slog.String("decision", string(ev.Decision)),
		slog.String("caller", ev.Caller),
		slog.String("scope", ev.Scope),
		slog.String("key", ev.Key),
		slog.Duration("duration", ev.Duration))
	if ev.Route != "" {
		attrs = append(attrs, slog.String("route", ev.Route))
	}
	if ev.ID != (ID{}) {
		attrs = append(attrs, slog.String("id", ev.ID.String())) // a problem's record_id
	}
	if ev.Status != 0 {
		attrs = append(attrs, slog.Int("status", ev.Status))
	}
	if ev.Attempt > 1 {
		attrs = append(attrs, slog.Int("attempt", ev.Attempt))
	}
	if ev.Err != nil {
		attrs = append(attrs, slog.String("error", ev.Err.Error()))
	}
	e.cfg.logger.LogAttrs(ctx, lvl, "idempotency", attrs...)
}
