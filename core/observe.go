package core

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"log/slog"
	"time"

	"github.com/idemkit/idem/core/observe"
	"github.com/idemkit/idem/core/store"
)

// level is the log level of ev: DEBUG for the routine decisions (executed,
// replayed, in progress, mismatch, released, resolved, invalid requests);
// WARN or ERROR only for what an operator must act on: store errors and
// fail-open (ERROR), indeterminate outcomes, lost leases and failing
// caller or fingerprint functions (WARN).
func level(ev *observe.Event) slog.Level {
	switch ev.Decision {
	case observe.DecisionExecuted, observe.DecisionReplayed, observe.DecisionReleased, observe.DecisionResolved, observe.DecisionRejectedBusy, observe.DecisionMismatch:
		return slog.LevelDebug
	case observe.DecisionSettled, observe.DecisionSettleReleased, observe.DecisionFinished:
		return slog.LevelInfo
	case observe.DecisionLeft, observe.DecisionSettleError:
		return slog.LevelWarn
	case observe.DecisionInvalid:
		var ce *callerError
		var fe *fingerprintError
		if errors.As(ev.Err, &ce) || errors.As(ev.Err, &fe) {
			return slog.LevelWarn
		}
		return slog.LevelDebug
	case observe.DecisionIndeterminate, observe.DecisionLeaseLost:
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
func (e *Engine) emit(ctx context.Context, ev observe.Event, start time.Time) {
	lvl := level(&ev)
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
	if ev.ID != (store.ID{}) {
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
