package idemclient

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

func TestOptions(t *testing.T) {
	for _, tc := range []struct {
		name string
		opt  Option
		want string // "" when valid
	}{
		{"OkOneAttempt", WithMaxAttempts(1), ""},
		{"NokZeroAttempts", WithMaxAttempts(0), "WithMaxAttempts(0)"},
		{"NokNoElapsed", WithMaxElapsed(0), "WithMaxElapsed(0s)"},
		{"OkNoAttemptTimeout", WithAttemptTimeout(0), ""},
		{"NokNegativeAttemptTimeout", WithAttemptTimeout(-time.Second), "WithAttemptTimeout(-1s)"},
		{"NokBackoffMaxUnderBase", WithBackoff(time.Second, time.Millisecond), "WithBackoff(1s, 1ms)"},
		{"NokBackoffZeroBase", WithBackoff(0, time.Second), "WithBackoff(0s, 1s)"},
		{"OkNeverBuffer", WithMaxBufferedBody(0), ""},
		{"NokNegativeBuffer", WithMaxBufferedBody(-1), "WithMaxBufferedBody(-1)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := NewTransport(nil, tc.opt)
			if tc.want == "" && err != nil {
				t.Fatalf("refused: %v", err)
			}
			if tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
				t.Fatalf("error %v, want one naming %s", err, tc.want)
			}
		})
	}
}

// A Transport over another retries every attempt of the outer one: refused.
func TestNestedTransportRefused(t *testing.T) {
	inner, err := NewTransport(nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := NewTransport(inner); err == nil {
		t.Fatal("a Transport over a Transport was accepted")
	}
}

func TestNewKey(t *testing.T) {
	seen := map[string]bool{}
	for range 1000 {
		k := NewKey()
		if !uuidV4.MatchString(k) {
			t.Fatalf("%q is not a UUID v4", k)
		}
		if seen[k] {
			t.Fatalf("%q twice", k)
		}
		seen[k] = true
	}
}

// The real wait ends with the context.
func TestSleepHonoursContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := sleep(ctx, time.Hour); !errors.Is(err, context.Canceled) {
		t.Fatalf("sleep: %v, want context.Canceled at once", err)
	}
	if err := sleep(context.Background(), time.Millisecond); err != nil {
		t.Fatalf("sleep: %v", err)
	}
}

func TestRetryAfterParse(t *testing.T) {
	now := time.Date(2026, 11, 30, 8, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		v    string
		want time.Duration
		ok   bool
	}{
		{"", 0, false},
		{"0", 0, true},
		{"7", 7 * time.Second, true},
		{"+7", 0, false},
		{"1.5", 0, false},
		{"Mon, 30 Nov 2026 08:00:09 GMT", 9 * time.Second, true},
		{"Mon, 30 Nov 2026 07:59:00 GMT", 0, true}, // past: no wait
		{"99999999999999999999", maxWait, true},
		{"tomorrow", 0, false},
	} {
		h := http.Header{}
		if tc.v != "" {
			h.Set("Retry-After", tc.v)
		}
		if d, ok := retryAfter(h, now); d != tc.want || ok != tc.ok {
			t.Errorf("Retry-After %q: %s %v, want %s %v", tc.v, d, ok, tc.want, tc.ok)
		}
	}
}

// Error reports a timeout the way net/http's errors do.
func TestErrorTimeout(t *testing.T) {
	if !(&Error{Err: ErrAttemptTimeout}).Timeout() || (&Error{Err: errors.New("reset")}).Timeout() {
		t.Fatal("Timeout() wrong")
	}
}

// The zero Transport says how to make one instead of panicking.
func TestZeroTransport(t *testing.T) {
	req, _ := http.NewRequest(http.MethodPost, "http://127.0.0.1:1/", strings.NewReader("x"))
	_, err := (&Transport{}).RoundTrip(req)
	if err == nil || !strings.Contains(err.Error(), "NewTransport") {
		t.Fatalf("error %v, want one naming NewTransport", err)
	}
}

type failingReader struct{}

func (failingReader) Read([]byte) (int, error) { return 0, errors.New("disk gone") }

// A body that cannot be read before the first attempt, or a GetBody that
// fails before a retry, ends the request with an *Error carrying the key.
func TestBodyErrors(t *testing.T) {
	s := newServer(t, drop, answer(201))
	tr, _ := newTransport(t)
	req, _ := http.NewRequest(http.MethodPost, s.URL, io.NopCloser(failingReader{}))
	_, err := tr.RoundTrip(req)
	var e *Error
	if !errors.As(err, &e) || e.Key == "" || e.Attempts != 0 || !strings.Contains(err.Error(), "disk gone") {
		t.Errorf("unreadable body: %v, want an *Error with a key and no attempt", err)
	}
	req, _ = http.NewRequest(http.MethodPost, s.URL, strings.NewReader("x"))
	req.GetBody = func() (io.ReadCloser, error) { return nil, errors.New("no copy") }
	_, err = tr.RoundTrip(req)
	if !errors.As(err, &e) || e.Attempts != 1 || !strings.Contains(err.Error(), "GetBody") {
		t.Errorf("failing GetBody: %v, want an *Error after 1 attempt naming GetBody", err)
	}
	if n := len(s.Seen()); n != 1 {
		t.Errorf("%d requests reached the server, want 1", n)
	}
}
