package idemclient

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
)

// NewKey returns a fresh random key: a UUID version 4 from crypto/rand.
// Make one per logical operation (one payment, one order) and keep it with
// the operation, so that a retry after a crash of the client uses it again.
func NewKey() string {
	var b [16]byte
	_, _ = rand.Read(b[:])  // never fails (crypto/rand.Read, Go 1.24+)
	b[6] = b[6]&0x0f | 0x40 // version 4
	b[8] = b[8]&0x3f | 0x80 // variant RFC 9562
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// Replayed reports whether resp is the server's replay of an answer it
// recorded for an earlier request with the same key (Idempotent-Replayed:
// true): the work was not done again.
func Replayed(resp *http.Response) bool {
	return resp != nil && strings.EqualFold(strings.TrimSpace(resp.Header.Get(HeaderReplayed)), "true")
}

// Key returns the Idempotency-Key that resp's request was sent with, "" if
// none.
func Key(resp *http.Response) string {
	if resp == nil || resp.Request == nil {
		return ""
	}
	return resp.Request.Header.Get(HeaderKey)
}

// Attempts returns how many attempts a Transport made for resp (1 when it
// was answered at once), or 0 when resp did not come through a Transport
// (a GET, or another client).
func Attempts(resp *http.Response) int {
	if resp == nil || resp.Request == nil {
		return 0
	}
	n, _ := resp.Request.Context().Value(attemptKey{}).(int)
	return n
}

// Error is the error of a request whose last attempt failed without a
// response (or could not be sent). The operation may or may not have taken
// effect: retry it later with Key, never with a new key.
type Error struct {
	Key      string // the Idempotency-Key every attempt carried
	Attempts int    // attempts made (0: the request could not be prepared)
	Err      error  // the last attempt's error: ErrAttemptTimeout, a network error, the context's error
}

func (e *Error) Error() string {
	return fmt.Sprintf("idemclient: %d attempt(s), the last: %v", e.Attempts, e.Err)
}

func (e *Error) Unwrap() error { return e.Err }

// Timeout reports whether the last attempt ended by a timeout (so that
// url.Error.Timeout and net.Error checks see it).
func (e *Error) Timeout() bool {
	var ne net.Error
	return errors.Is(e.Err, ErrAttemptTimeout) || errors.Is(e.Err, context.DeadlineExceeded) ||
		(errors.As(e.Err, &ne) && ne.Timeout())
}
