package core

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"
)

// Problem is an RFC 9457 problem document for a rejection.
type Problem struct {
	// Type is the problem base (WithProblemBase) followed by a stable slug:
	// missing-key, invalid-key, key-reused, in-progress, lease-lost,
	// transaction-aborted, store-unavailable, body-too-large, invalid-request, body-consumed,
	// not-protected, unauthenticated,
	// response-not-kept, outcome-unknown, internal (see docs/problems.md).
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	// Detail is written for the client. It never carries the text of a
	// store, driver or caller-function error: those go to the log, with
	// the record's ID.
	Detail string `json:"detail,omitempty"`
	// RecordID is an extension member: the record's ID (hex SHA-256 of
	// caller, scope and key), set once the identity is known. The engine's
	// log lines carry the same value as "id", so a client quoting it lets
	// an operator find the internal error behind the problem.
	RecordID string `json:"record_id,omitempty"`
	// Docs is the documentation the problem links to: WriteProblem sends
	// it as Link: <Docs>; rel="describedby" (WithProblemDocs; "": none).
	Docs string `json:"-"`
	// Err is the sentinel error behind the problem, one of core/errors.go
	// (ErrMismatch, ErrInProgress, ...; ErrInternal for the internal type),
	// to match with errors.Is. It is the sentinel itself and never carries
	// the text of an internal error (a store's, a temporary file's, a
	// panic's): that goes to the log, under RecordID.
	Err error `json:"-"`
	// RetryAfter, when positive, is sent as Retry-After (whole seconds,
	// rounded up).
	RetryAfter time.Duration `json:"-"`
}

// WriteProblem is the default writer of problem documents
// (WithErrorWriter): application/problem+json with
// Cache-Control: no-store, Link: <Docs>; rel="describedby" when p.Docs is
// set (the engine sets it: WithProblemDocs) and, when set, Retry-After.
func WriteProblem(w http.ResponseWriter, _ *http.Request, p *Problem) {
	h := w.Header()
	h.Set("Content-Type", "application/problem+json")
	h.Set("Cache-Control", "no-store")
	if p.Docs != "" {
		h.Set("Link", "<"+p.Docs+`>; rel="describedby"`)
	}
	if p.RetryAfter > 0 {
		h.Set("Retry-After", strconv.FormatInt(int64((p.RetryAfter+time.Second-1)/time.Second), 10))
	}
	body, _ := json.Marshal(p)
	w.WriteHeader(p.Status)
	_, _ = w.Write(body)
}

type problemKind struct {
	err    error
	slug   string
	title  string
	detail string // written for the client: never an internal error's text
	status int
}

var problemKinds = []problemKind{
	{ErrMissingKey, "missing-key", "Idempotency-Key header is required",
		"send an Idempotency-Key header with a value unique to this operation", http.StatusBadRequest},
	{ErrInvalidKey, "invalid-key", "Malformed Idempotency-Key",
		"the Idempotency-Key must be sent once, 1 to 255 bytes without control characters, raw or as a quoted string", http.StatusBadRequest},
	{ErrMismatch, "key-reused", "Idempotency-Key reused with a different request",
		"this Idempotency-Key was used for a different request; use a new key for a new operation", http.StatusUnprocessableEntity},
	{ErrInProgress, "in-progress", "A request with this Idempotency-Key is in progress",
		"a request with this Idempotency-Key is still being processed; retry with the same key after Retry-After", http.StatusConflict},
	{ErrLostRace, "in-progress", "A request with this Idempotency-Key is in progress",
		"a concurrent request with this Idempotency-Key was committed first; retry with the same key after Retry-After to get its answer", http.StatusConflict},
	{ErrLeaseLost, "lease-lost", "This attempt lost its lease to a newer one",
		"another attempt with this Idempotency-Key took over; retry with the same key to get its answer", http.StatusConflict},
	{ErrOutcomePending, "outcome-pending", "The outcome of this request is being settled",
		"the request may have taken effect and its outcome could not be recorded yet; retry with the same Idempotency-Key after Retry-After to get it", http.StatusServiceUnavailable},
	{ErrTxAborted, "transaction-aborted", "The request's transaction was aborted",
		"the database aborted this request's transaction, so nothing of it was committed; retry with the same key after Retry-After", http.StatusServiceUnavailable},
	{ErrStoreUnavailable, "store-unavailable", "Idempotency store unavailable",
		"the idempotency store is unavailable; retry with the same key after Retry-After", http.StatusServiceUnavailable},
	{ErrBodyTooLarge, "body-too-large", "Request body too large",
		"the request body is too large", http.StatusRequestEntityTooLarge},
	{ErrInvalidRequest, "invalid-request", "Request body could not be read",
		"the request body could not be read", http.StatusBadRequest},
	{ErrBodyConsumed, "body-consumed", "The request body could not be read",
		"the server could not read the request body; this is a fault of the server, not of the request", http.StatusInternalServerError},
	{ErrNotProtected, "not-protected", "The request could not be protected",
		"the server could not establish how to protect this request, so it was not run; this is a fault of the server, not of the request", http.StatusInternalServerError},
	{ErrNoCaller, "unauthenticated", "Caller not identified",
		"the caller could not be identified", http.StatusUnauthorized},
	{ErrNotKept, "response-not-kept", "The first response's body was not kept",
		"the first response was too large or streamed, so only its status was recorded", http.StatusInternalServerError},
	{ErrIndeterminate, "outcome-unknown", "The outcome of an earlier attempt is unknown",
		"an earlier attempt with this Idempotency-Key may have taken effect and its outcome is not known; it is not run again", http.StatusInternalServerError},
}

// internalDetail is the detail of a problem without a kind (a panic).
const internalDetail = "the request could not be completed"

// clientError is an error whose detail was written by the engine for the
// client (which header was wrong, the body limit). Only such text reaches
// a problem's detail: the text of any other error (a store's, a driver's, a
// caller function's) may carry hosts, user names or SQL and goes to the log
// only.
type clientError struct {
	err    error  // the sentinel
	detail string // safe to show the client
}

func (e *clientError) Error() string { return e.err.Error() + ": " + e.detail }
func (e *clientError) Unwrap() error { return e.err }

// clientErrorf returns sentinel with a detail for the client.
func clientErrorf(sentinel error, format string, args ...any) error {
	return &clientError{err: sentinel, detail: fmt.Sprintf(format, args...)}
}

// problemFor builds the problem document for err (a wrapped sentinel). Its
// detail is the kind's text for the client, followed by the engine's own
// precision when err carries one (clientError); never err's text. Its Err
// is the kind's sentinel, or ErrInternal: never err, which may hold an
// internal error (the caller logs it).
func (e *Engine) problemFor(err error) *Problem {
	p := &Problem{Type: e.cfg.problemBase + "internal", Title: "Internal error", Detail: internalDetail, Status: http.StatusInternalServerError, Err: ErrInternal}
	for _, k := range problemKinds {
		if errors.Is(err, k.err) {
			p.Type, p.Title, p.Detail, p.Status, p.Err = e.cfg.problemBase+k.slug, k.title, k.detail, k.status, k.err
			break
		}
	}
	p.Title, p.Detail, p.Docs = e.namedKeyHeader(p.Title), e.namedKeyHeader(p.Detail), e.problemDocs()
	var ce *clientError
	if errors.As(err, &ce) {
		p.Detail += ": " + ce.detail // what exactly, in the engine's own words
	}
	var re *RetryError
	if errors.As(err, &re) {
		p.RetryAfter = re.RetryAfter
	}
	if p.RetryAfter == 0 && (p.Err == ErrStoreUnavailable || p.Err == ErrInProgress || p.Err == ErrLeaseLost || p.Err == ErrLostRace || p.Err == ErrTxAborted || p.Err == ErrOutcomePending) {
		p.RetryAfter = max(e.cfg.retryAfter, time.Second)
	}
	return p
}
