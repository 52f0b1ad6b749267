package storeutil

import (
	"bytes"
	"time"

	"github.com/idemkit/idem/core"
)

// NullBytes is b as a column value: NULL when b is nil.
func NullBytes(b []byte) any {
	if b == nil {
		return nil
	}
	return b
}

// ColTime is t as a timestamp column returns it: UTC, microseconds.
func ColTime(t time.Time) time.Time {
	if t.IsZero() {
		return time.Time{}
	}
	return t.UTC().Truncate(time.Microsecond)
}

// NewRecord is the record a claim writes, with times as the columns keep
// them.
func NewRecord(req core.ClaimRequest) core.Record {
	return core.Record{
		ID: req.ID, Caller: req.Caller, Scope: req.Scope, Key: req.Key, Fingerprint: bytes.Clone(req.Fingerprint),
		State: core.StateInProgress, Token: req.Token, Attempt: 1,
		LeaseUntil: ColTime(req.LeaseUntil), ExpiresAt: ColTime(req.ExpiresAt), CreatedAt: ColTime(req.Now),
	}
}

// Live reports whether rec is live at now.
func Live(rec core.Record, now time.Time) bool { return rec.ExpiresAt.After(now) }

// Takeable reports whether req may take rec over (lapsed lease, Takeover).
func Takeable(rec core.Record, req core.ClaimRequest) bool {
	return req.Takeover && rec.State == core.StateInProgress && !rec.LeaseUntil.IsZero() && !rec.LeaseUntil.After(req.Now)
}

// InProgressElsewhere is the answer when another transaction holds the
// identity and its row is not visible.
func InProgressElsewhere(id core.ID) core.ClaimResult {
	return core.ClaimResult{Record: core.Record{ID: id, State: core.StateInProgress}}
}
