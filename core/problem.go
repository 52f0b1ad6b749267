package core

import (
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"time"
)

// Problem is an RFC 9457 problem document for a rejection.
type Problem struct {
	// Type is the problem base (WithProblemBase) followed by a stable slug:
	// missing-key, invalid-key, key-reused, in-progress, lease-lost,
	// store-unavailable, body-too-large, invalid-request, body-consumed,
	// not-protected, unauthenticated,
	// response-not-kept, outcome-unknown, internal (see docs/problems.md).
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail,omitempty"`
	// Err is the sentinel error (errors.Is) behind the problem.
	Err error `json:"-"`
	// RetryAfter, when positive, is sent as Retry-After (whole seconds,
	// rounded up).
	RetryAfter time.Duration `json:"-"`
}

// ErrorWriter writes a problem document; replace it with WithErrorWriter.
type ErrorWriter func(w http.ResponseWriter, r *http.Request, p *Problem)

// WriteProblem is the default ErrorWriter: application/problem+json with
// Cache-Control: no-store and, when set, Retry-After.
func WriteProblem(w http.ResponseWriter, _ *http.Request, p *Problem) {
	h := w.Header()
	h.Set("Content-Type", "application/problem+json")
	h.Set("Cache-Control", "no-store")
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
	status int
}

var problemKinds = []problemKind{
	{ErrMissingKey, "missing-key", "Idempotency-Key header is required", http.StatusBadRequest},
	{ErrInvalidKey, "invalid-key", "Malformed Idempotency-Key", http.StatusBadRequest},
	{ErrMismatch, "key-reused", "Idempotency-Key reused with a different request", http.StatusUnprocessableEntity},
	{ErrInProgress, "in-progress", "A request with this Idempotency-Key is in progress", http.StatusConflict},
	{ErrLeaseLost, "lease-lost", "This attempt lost its lease to a newer one", http.StatusConflict},
	{ErrStoreUnavailable, "store-unavailable", "Idempotency store unavailable", http.StatusServiceUnavailable},
	{ErrBodyTooLarge, "body-too-large", "Request body too large", http.StatusRequestEntityTooLarge},
	{ErrBodyConsumed, "body-consumed", "The request body could not be read", http.StatusInternalServerError},
	{ErrNotProtected, "not-protected", "The request could not be protected", http.StatusInternalServerError},
	{ErrNoCaller, "unauthenticated", "Caller not identified", http.StatusUnauthorized},
	{ErrNotKept, "response-not-kept", "The first response's body was not kept", http.StatusInternalServerError},
	{ErrIndeterminate, "outcome-unknown", "The outcome of an earlier attempt is unknown", http.StatusInternalServerError},
}

// problemFor builds the problem document for err (a wrapped sentinel).
func (e *Engine) problemFor(err error) *Problem {
	p := &Problem{Type: e.cfg.problemBase + "internal", Title: "Internal error", Status: http.StatusInternalServerError, Err: err}
	for _, k := range problemKinds {
		if errors.Is(err, k.err) {
			p.Type, p.Title, p.Status, p.Err = e.cfg.problemBase+k.slug, k.title, k.status, k.err
			break
		}
	}
	p.Detail = err.Error()
	var re *RetryError
	if errors.As(err, &re) {
		p.RetryAfter = re.RetryAfter
		p.Detail = re.Err.Error()
	}
	if p.RetryAfter == 0 && (p.Err == ErrStoreUnavailable || p.Err == ErrInProgress || p.Err == ErrLeaseLost) {
		p.RetryAfter = max(e.cfg.retryAfter, time.Second)
	}
	return p
}
