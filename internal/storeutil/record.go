package storeutil

import (
	"bytes"
	"time"

	"github.com/idemkit/idem/core/store"
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
func NewRecord(req store.ClaimRequest) store.Record {
	return store.Record{
		ID: req.ID, Caller: req.Caller, Scope: req.Scope, Key: req.Key, Fingerprint: bytes.Clone(req.Fingerprint),
		State: store.StateInProgress, Token: req.Token, Attempt: 1,
		LeaseUntil: ColTime(req.LeaseUntil), ExpiresAt: ColTime(req.ExpiresAt), CreatedAt: ColTime(req.Now),
	}
}

// Live reports whether rec is live at now.
func Live(rec store.Record, now time.Time) bool { return rec.ExpiresAt.After(now) }

// Takeable reports whether req may take rec over (lapsed lease, Takeover).
func Takeable(rec store.Record, req store.ClaimRequest) bool {
	return req.Takeover && rec.State == store.StateInProgress && !rec.LeaseUntil.IsZero() && !rec.LeaseUntil.After(req.Now)
}

// InProgressElsewhere is the answer when another transaction holds the
// identity and its row is not visible.
func InProgressElsewhere(id store.ID) store.ClaimResult {
	return store.ClaimResult{Record: store.Record{ID: id, State: store.StateInProgress}}
}
