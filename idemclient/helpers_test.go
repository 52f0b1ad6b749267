package idemclient

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeClock is the Transport's clock in the tests: a wait is recorded and
// moves the clock on at once (a wait whose context has ended is recorded
// and returns the context's error). It refuses to wait past a day of
// virtual time (errEndless): attempts are bounded by time only, so a
// Transport whose time bound is broken (a mutant) would otherwise retry
// without end, at full speed.
type fakeClock struct {
	mu      sync.Mutex
	now     time.Time
	slept   time.Duration
	waits   []time.Duration
	onSleep func() // called at the start of each wait, if set
}

func newClock() *fakeClock {
	// Real time (the requests' context deadlines are real), on a whole
	// second (HTTP dates have seconds).
	return &fakeClock{now: time.Now().Truncate(time.Second).Add(time.Second)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Sleep(ctx context.Context, d time.Duration) error {
	if c.onSleep != nil {
		c.onSleep()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.waits = append(c.waits, d)
	if err := ctx.Err(); err != nil {
		return err
	}
	if c.slept += d; c.slept > 24*time.Hour {
		return errEndless
	}
	c.now = c.now.Add(d)
	return nil
}

var errEndless = errors.New("test: the Transport waited more than a day of virtual time: its retries have no end")

func (c *fakeClock) Waits() []time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]time.Duration(nil), c.waits...)
}

// newTransport is a Transport on the fake clock whose jitter is always the
// largest possible wait (so the backoff is its ceiling), over a base that
// opens a new connection for every attempt (so that net/http never resends
// a request on a reused connection by itself).
func newTransport(t testing.TB, opts ...Option) (*Transport, *fakeClock) {
	t.Helper()
	base := &http.Transport{DisableKeepAlives: true, Proxy: nil}
	t.Cleanup(base.CloseIdleConnections)
	tr, err := NewTransport(base, opts...)
	if err != nil {
		t.Fatal(err)
	}
	c := newClock()
	tr.now, tr.sleep, tr.jitter = c.Now, c.Sleep, func(n int64) int64 { return n - 1 }
	return tr, c
}

// seen is one request as the test server received it.
type seen struct {
	method string
	keys   []string
	body   string
}

// step answers one attempt (n counts from 1).
type step func(w http.ResponseWriter, r *http.Request, n int)

// testServer answers the n-th request with the n-th step (the last one
// again after the end) and records every request.
type testServer struct {
	*httptest.Server
	mu    sync.Mutex
	seen  []seen
	steps []step
}

func newServer(t testing.TB, steps ...step) *testServer {
	t.Helper()
	s := &testServer{steps: steps}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		s.mu.Lock()
		s.seen = append(s.seen, seen{method: r.Method, keys: r.Header.Values(HeaderKey), body: string(b)})
		n := len(s.seen)
		s.mu.Unlock()
		s.steps[min(n, len(s.steps))-1](w, r, n)
	}))
	t.Cleanup(s.Close)
	return s
}

func (s *testServer) Seen() []seen {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]seen(nil), s.seen...)
}

// answer answers code with the header fields given as name, value pairs,
// and the body "<code> to attempt <n>".
func answer(code int, header ...string) step {
	return func(w http.ResponseWriter, r *http.Request, n int) {
		for i := 0; i+1 < len(header); i += 2 {
			w.Header().Set(header[i], header[i+1])
		}
		w.WriteHeader(code)
		fmt.Fprintf(w, "%d to attempt %d", code, n)
	}
}

// drop closes the connection without an answer, after the request was read
// (the server may have acted).
func drop(w http.ResponseWriter, r *http.Request, n int) {
	conn, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		panic(err)
	}
	conn.Close()
}

// hang sends nothing until the client goes away.
func hang(w http.ResponseWriter, r *http.Request, n int) { <-r.Context().Done() }

// send sends method with body through rt and reads the answer.
func send(t testing.TB, rt http.RoundTripper, ctx context.Context, method, url, body string, header ...string) (*http.Response, string, error) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	return do(t, rt, req)
}

func do(t testing.TB, rt http.RoundTripper, req *http.Request) (*http.Response, string, error) {
	t.Helper()
	resp, err := (&http.Client{Transport: rt}).Do(req)
	if err != nil {
		return nil, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("reading the answer: %v", err)
	}
	return resp, string(b), nil
}

// mustSend is send that fails on an error.
func mustSend(t testing.TB, rt http.RoundTripper, method, url, body string, header ...string) (*http.Response, string) {
	t.Helper()
	resp, b, err := send(t, rt, context.Background(), method, url, body, header...)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	return resp, b
}

// oneKey checks that every request carried one and the same key, and
// returns it.
func oneKey(t testing.TB, seen []seen) string {
	t.Helper()
	if len(seen) == 0 {
		t.Fatal("no request reached the server")
	}
	for i, s := range seen {
		if len(s.keys) != 1 || s.keys[0] != seen[0].keys[0] {
			t.Fatalf("attempt %d carried keys %q, the first %q", i+1, s.keys, seen[0].keys)
		}
	}
	return seen[0].keys[0]
}

func discardLog() *log.Logger { return log.New(io.Discard, "", 0) }

// repeat is n times the step st.
func repeat(n int, st step) []step {
	steps := make([]step, n)
	for i := range steps {
		steps[i] = st
	}
	return steps
}

func sum(ds []time.Duration) time.Duration {
	var t time.Duration
	for _, d := range ds {
		t += d
	}
	return t
}
