// Package admin is the operator's view of idem's records: what
// core.Engine.Records, Engine.Record and Engine.ResolveRecord return, and
// the JSON documents of Engine.AdminHandler and of idemctl -json
// (docs/contract.md, section 5 "Recovery without a client"). The engine
// fills them in; this package holds no behaviour of its own, so a client
// of the admin API decodes the same types the server encodes:
//
//	page, err := e.Records(ctx, admin.Query{State: store.StateIndeterminate, OlderThan: time.Hour})
package admin

import (
	"net/http"
	"time"

	"github.com/idemkit/idem/core/store"
)

// Query selects the records core.Engine.Records lists.
type Query struct {
	// State is the state listed (default store.StateIndeterminate: the records
	// whose outcome is unknown).
	State store.State
	// OlderThan, when positive, lists only records created at least that
	// long ago (by the engine's clock): an in-progress record younger than
	// the route's core.MaxAttempt is usually an attempt still running.
	OlderThan time.Duration
	// After is the Next of the previous page ("" for the first).
	After string
	// Limit is the most records on the page (default core.DefaultRecordsLimit,
	// at most store.MaxListLimit).
	Limit int
}

// Page is one page of core.Engine.Records.
type Page struct {
	Records []Record `json:"records"`
	// Next, when not empty, is the Query.After of the next page. It
	// is empty after the last one.
	Next string `json:"next,omitempty"`
}

// Record is what an operator sees of a stored record (store.Record).
// Times are UTC.
type Record struct {
	// ID is the record's ID in hex: the record_id of the problem
	// documents clients get, and the "id" of the engine's log lines.
	ID    string `json:"record_id"`
	State string `json:"state"` // in_progress, completed, indeterminate
	// Caller, Scope and Key are the record's debug copies (at most
	// store.MaxDebugLen bytes each).
	Caller      string `json:"caller"`
	Scope       string `json:"scope"`
	Key         string `json:"key"`
	Fingerprint string `json:"fingerprint,omitempty"` // hex
	// Attempt counts the record's claims: 1, +1 per takeover.
	Attempt   int       `json:"attempt"`
	CreatedAt time.Time `json:"created_at"`
	ExpiresAt time.Time `json:"expires_at"`
	// LeaseUntil is when the holder's lease lapses (in progress, leased
	// mode); LeaseLapsed reports that it has, by the engine's clock: the
	// attempt stopped without recording an outcome.
	LeaseUntil  *time.Time `json:"lease_until,omitempty"`
	LeaseLapsed bool       `json:"lease_lapsed,omitempty"`
	// Status is the recorded HTTP status (completed, indeterminate).
	Status int `json:"status,omitempty"`
	// Response is the recorded response, opened with the engine's sealer
	// (core.WithSealer; Engine.Record and the actions only: a listing does not read
	// responses). ResponseError says why it could not be opened (sealed
	// and no sealer, or the wrong one).
	Response      *Response `json:"response,omitempty"`
	ResponseError string    `json:"response_error,omitempty"`
	// Why says in a sentence what the state means and what happens next.
	Why string `json:"why"`
}

// Response is a recorded response as an operator reads it.
type Response struct {
	Status int         `json:"status"`
	Header http.Header `json:"header,omitempty"`
	// Body is the recorded body when it is valid UTF-8 (JSON, text);
	// BodyBase64 holds it otherwise (encoding/json writes []byte in
	// base64).
	Body       string `json:"body,omitempty"`
	BodyBase64 []byte `json:"body_base64,omitempty"`
	// BodyKept is false when the body was too large or streamed: it was
	// not recorded, and replays say so.
	BodyKept bool `json:"body_kept"`
}
