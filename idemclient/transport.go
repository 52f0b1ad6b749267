package idemclient

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"time"
)

// Header names of the protocol.
const (
	HeaderKey      = "Idempotency-Key"     // sent with every non-safe request
	HeaderReplayed = "Idempotent-Replayed" // "true" on an answer replayed from the server's record
)

// ErrAttemptTimeout is the error of an attempt whose response headers did
// not come within WithAttemptTimeout.
var ErrAttemptTimeout = errors.New("idemclient: no response headers within the attempt timeout")

// Transport is an http.RoundTripper that sends every non-safe request with
// an Idempotency-Key and retries it with the same key and body (see the
// package documentation for the rules). Make it with NewTransport (the
// zero value answers every request with an error saying so). It is safe
// for concurrent use.
type Transport struct {
	base http.RoundTripper
	cfg  config

	// Replaced by the tests: the clock, the wait between attempts and the
	// jitter (a uniform int64 in [0, n)).
	now    func() time.Time
	sleep  func(ctx context.Context, d time.Duration) error
	jitter func(n int64) int64
}

var _ http.RoundTripper = (*Transport)(nil)

// NewTransport returns a Transport that sends its attempts through base
// (http.DefaultTransport when nil). It returns an error for a bad option.
func NewTransport(base http.RoundTripper, opts ...Option) (*Transport, error) {
	if base == nil {
		base = http.DefaultTransport
	}
	if _, nested := base.(*Transport); nested {
		return nil, errors.New("idemclient: NewTransport over another idemclient.Transport: every attempt of the outer one would be retried by the inner one; use one Transport")
	}
	t := &Transport{base: base, cfg: defaults(), now: time.Now, sleep: sleep, jitter: rand.Int64N}
	for _, o := range opts {
		if err := o.apply(&t.cfg); err != nil {
			return nil, err
		}
	}
	return t, nil
}

// NewClient returns an *http.Client whose Transport is NewTransport(nil,
// opts...). It has no Timeout of its own: a request is bounded by its
// context, WithMaxElapsed and WithAttemptTimeout.
func NewClient(opts ...Option) (*http.Client, error) {
	t, err := NewTransport(nil, opts...)
	if err != nil {
		return nil, err
	}
	return &http.Client{Transport: t}, nil
}

// RoundTrip sends req, and again while the answer says so.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	if t.base == nil {
		if req.Body != nil {
			req.Body.Close()
		}
		return nil, errors.New("idemclient: a Transport must be made with NewTransport or NewClient")
	}
	if !keyed(req.Method) {
		return t.base.RoundTrip(req)
	}
	key, given := keyOf(req)
	first, again, err := t.bodies(req)
	if err != nil {
		return nil, &Error{Key: key, Err: err}
	}
	ctx := req.Context()
	start := t.now()
	body := first
	for n := 1; ; n++ {
		resp, err := t.attempt(req, key, given, n, body, again)
		wait, retry := t.retryable(ctx, resp, err)
		if !retry || (t.cfg.maxAttempts > 0 && n >= t.cfg.maxAttempts) || again == nil {
			return t.finish(key, n, resp, err)
		}
		if wait <= 0 {
			// No Retry-After, or one of no wait: the backoff spaces the
			// attempts (time is the only bound; a server that keeps
			// answering "Retry-After: 0" must not get a tight loop).
			wait = t.backoff(n)
		}
		if !t.fits(ctx, start, wait) {
			return t.finish(key, n, resp, err)
		}
		if t.cfg.onRetry != nil {
			t.cfg.onRetry(retryOf(req, key, n, resp, err, wait))
		}
		if resp != nil {
			discard(resp.Body)
		}
		if err := t.sleep(ctx, wait); err != nil {
			return nil, &Error{Key: key, Attempts: n, Err: err}
		}
		if body, err = again(); err != nil {
			return nil, &Error{Key: key, Attempts: n, Err: fmt.Errorf("idemclient: Request.GetBody: %w", err)}
		}
	}
}

// CloseIdleConnections closes the base transport's idle connections, if it
// has that method (http.Client.CloseIdleConnections calls it).
func (t *Transport) CloseIdleConnections() {
	if c, ok := t.base.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

// keyed reports whether requests with method get a key and retries: every
// method but the safe ones.
func keyed(method string) bool {
	switch method {
	case "", http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace:
		return false
	}
	return true
}

// keyOf is the caller's key, if the request has one, or a new one.
func keyOf(req *http.Request) (key string, given bool) {
	if vs := req.Header.Values(HeaderKey); len(vs) > 0 {
		return vs[0], true
	}
	return NewKey(), false
}

// bodies returns the body of the first attempt and a function that returns
// the body of each later one, nil when the body cannot be sent again.
func (t *Transport) bodies(req *http.Request) (first io.ReadCloser, again func() (io.ReadCloser, error), err error) {
	switch {
	case req.Body == nil || req.Body == http.NoBody:
		return req.Body, func() (io.ReadCloser, error) { return req.Body, nil }, nil
	case req.GetBody != nil:
		return req.Body, req.GetBody, nil
	case t.cfg.maxBufferedBody == 0:
		return req.Body, nil, nil
	}
	buf, err := io.ReadAll(io.LimitReader(req.Body, t.cfg.maxBufferedBody+1))
	if err != nil {
		req.Body.Close()
		return nil, nil, fmt.Errorf("idemclient: reading the request body: %w", err)
	}
	if int64(len(buf)) > t.cfg.maxBufferedBody {
		// Too long to keep: sent once, what was read followed by the rest.
		return readCloser{io.MultiReader(bytes.NewReader(buf), req.Body), req.Body}, nil, nil
	}
	req.Body.Close()
	again = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(buf)), nil }
	first, _ = again()
	return first, again, nil
}

type readCloser struct {
	io.Reader
	io.Closer
}

// attemptKey is the context key of an attempt's number (Attempts).
type attemptKey struct{}

// attempt sends the n-th attempt: a clone of req with the key, body and, if
// there is an attempt timeout, a context that ends when it passes without
// response headers.
func (t *Transport) attempt(req *http.Request, key string, given bool, n int, body io.ReadCloser, again func() (io.ReadCloser, error)) (*http.Response, error) {
	ctx := context.WithValue(req.Context(), attemptKey{}, n)
	var cancel context.CancelCauseFunc
	var timer *time.Timer
	if t.cfg.attemptTimeout > 0 {
		ctx, cancel = context.WithCancelCause(ctx)
		timer = time.AfterFunc(t.cfg.attemptTimeout, func() { cancel(ErrAttemptTimeout) })
	}
	r := req.Clone(ctx)
	r.Body, r.GetBody = body, again // GetBody lets the base transport resend on a dead keep-alive connection
	if r.Header == nil {
		r.Header = make(http.Header)
	}
	if !given {
		r.Header.Set(HeaderKey, key)
	}
	resp, err := t.base.RoundTrip(r)
	if err == nil && resp.Request == nil {
		resp.Request = r
	}
	if cancel == nil {
		return resp, err
	}
	if !timer.Stop() && req.Context().Err() == nil {
		// The bound passed (the headers may have come just after it: that
		// answer is abandoned too; the retry gets it replayed).
		if resp != nil {
			resp.Body.Close()
		}
		return nil, ErrAttemptTimeout
	}
	if err != nil {
		cancel(nil)
		return nil, err
	}
	resp.Body = cancelOnClose(resp.Body, cancel)
	return resp, nil
}

// retryable reports whether the answer of an attempt calls for another one,
// and the wait the server asked for (0 or less: none, use the backoff).
func (t *Transport) retryable(ctx context.Context, resp *http.Response, err error) (wait time.Duration, retry bool) {
	if err != nil {
		if ctx.Err() != nil || permanent(err) {
			return 0, false
		}
		return -1, true
	}
	if Replayed(resp) {
		// The server's record of an earlier attempt (an outcome-unknown
		// 5xx, the handler's own 409): every retry gets it again.
		return 0, false
	}
	switch resp.StatusCode {
	case http.StatusConflict, http.StatusServiceUnavailable:
		return retryAfter(resp.Header, t.now())
	case http.StatusBadGateway, http.StatusGatewayTimeout:
		if d, ok := retryAfter(resp.Header, t.now()); ok {
			return d, true
		}
		return -1, true
	}
	return 0, false
}

// permanent reports whether a transport error would come back on every
// attempt: the server's certificate was refused, the host does not exist.
func permanent(err error) bool {
	var (
		verr *tls.CertificateVerificationError
		uerr x509.UnknownAuthorityError
		herr x509.HostnameError
		cerr x509.CertificateInvalidError
		derr *net.DNSError
	)
	return errors.As(err, &verr) || errors.As(err, &uerr) || errors.As(err, &herr) || errors.As(err, &cerr) ||
		(errors.As(err, &derr) && derr.IsNotFound)
}

// retryAfter parses a Retry-After header: delta-seconds or an HTTP date (a
// date in the past is no wait). ok is false when there is none or it does
// not parse.
func retryAfter(h http.Header, now time.Time) (d time.Duration, ok bool) {
	v := h.Get("Retry-After")
	if v == "" {
		return 0, false
	}
	if digits(v) {
		s, err := strconv.ParseInt(v, 10, 64)
		if err != nil || s > int64(maxWait/time.Second) {
			return maxWait, true // too long for any bound: fits nothing
		}
		return time.Duration(s) * time.Second, true
	}
	if at, err := http.ParseTime(v); err == nil {
		return max(at.Sub(now), 0), true
	}
	return 0, false
}

// maxWait is a wait longer than any bound.
const maxWait = 100 * 365 * 24 * time.Hour

func digits(s string) bool {
	for i := range len(s) {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return s != ""
}

// backoff is the wait after the n-th attempt without a Retry-After: a
// uniform random duration in [0, min(max, base·2^(n-1))].
func (t *Transport) backoff(n int) time.Duration {
	ceil := t.cfg.backoffBase
	for i := 1; i < n && ceil < t.cfg.backoffMax; i++ {
		ceil *= 2
	}
	ceil = min(ceil, t.cfg.backoffMax)
	return time.Duration(t.jitter(int64(ceil) + 1))
}

// fits reports whether a wait of d from now ends within WithMaxElapsed of
// start and before the context's deadline.
func (t *Transport) fits(ctx context.Context, start time.Time, d time.Duration) bool {
	end := t.now().Add(d)
	if end.After(start.Add(t.cfg.maxElapsed)) {
		return false
	}
	if dl, ok := ctx.Deadline(); ok && end.After(dl) {
		return false
	}
	return true
}

// finish returns the last attempt's answer: the response as it is, or its
// error as an *Error that carries the key.
func (t *Transport) finish(key string, n int, resp *http.Response, err error) (*http.Response, error) {
	if err != nil {
		return nil, &Error{Key: key, Attempts: n, Err: err}
	}
	return resp, nil
}

func retryOf(req *http.Request, key string, n int, resp *http.Response, err error, wait time.Duration) Retry {
	r := Retry{Request: req, Key: key, Attempt: n, Err: err, Wait: wait}
	if resp != nil {
		r.Status = resp.StatusCode
	}
	return r
}

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	tm := time.NewTimer(d)
	defer tm.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-tm.C:
		return nil
	}
}

// discard reads a little of a response that is not returned, so that its
// connection can be reused, and closes it.
func discard(body io.ReadCloser) {
	_, _ = io.CopyN(io.Discard, body, 64<<10)
	body.Close()
}

// cancelOnClose ends an attempt's context when the caller closes the body
// (a 101 Switching Protocols body stays writable).
func cancelOnClose(body io.ReadCloser, cancel context.CancelCauseFunc) io.ReadCloser {
	if rw, ok := body.(io.ReadWriteCloser); ok {
		return &cancelRWBody{rw, cancel}
	}
	return &cancelBody{body, cancel}
}

type cancelBody struct {
	io.ReadCloser
	cancel context.CancelCauseFunc
}

func (b *cancelBody) Close() error {
	err := b.ReadCloser.Close()
	b.cancel(nil)
	return err
}

type cancelRWBody struct {
	io.ReadWriteCloser
	cancel context.CancelCauseFunc
}

func (b *cancelRWBody) Close() error {
	err := b.ReadWriteCloser.Close()
	b.cancel(nil)
	return err
}
