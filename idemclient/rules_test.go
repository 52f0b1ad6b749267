package idemclient

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// A rule of the client, and the test that checks it. TestRulesCatchMutants
// breaks the code line by line and checks that these cases notice.
type rule struct {
	name string
	rule string
	run  func(t *testing.T)
}

var uuidV4 = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)

var rules = []rule{
	{"KeyAdded", "A POST without a key is sent with a fresh UUID v4 key, a new one per request; the caller's request is not modified.", func(t *testing.T) {
		s := newServer(t, answer(201))
		tr, _ := newTransport(t)
		req, _ := http.NewRequest(http.MethodPost, s.URL, strings.NewReader(`{"a":1}`))
		resp, _, err := do(t, tr, req)
		if err != nil {
			t.Fatal(err)
		}
		mustSend(t, tr, http.MethodPost, s.URL, `{"a":1}`)
		seen := s.Seen()
		k := oneKey(t, seen[:1])
		if !uuidV4.MatchString(k) {
			t.Errorf("key %q is not a UUID v4", k)
		}
		if seen[1].keys[0] == k {
			t.Errorf("two requests got the same key %q", k)
		}
		if Key(resp) != k || Attempts(resp) != 1 || Replayed(resp) {
			t.Errorf("Key %q Attempts %d Replayed %v, want %q 1 false", Key(resp), Attempts(resp), Replayed(resp), k)
		}
		if req.Header.Get(HeaderKey) != "" {
			t.Errorf("the caller's request was given the key %q", req.Header.Get(HeaderKey))
		}
	}},
	{"CallerKeyKept", "A request that carries an Idempotency-Key is sent with that key, on every attempt.", func(t *testing.T) {
		s := newServer(t, drop, answer(201))
		tr, _ := newTransport(t)
		resp, _ := mustSend(t, tr, http.MethodPost, s.URL, "x", HeaderKey, "order-42")
		if k := oneKey(t, s.Seen()); k != "order-42" || Key(resp) != "order-42" {
			t.Errorf("sent %q, Key(resp) %q, want order-42", k, Key(resp))
		}
	}},
	{"NonSafeMethodsKeyed", "PUT, PATCH, DELETE and methods unknown to HTTP are keyed and retried like POST.", func(t *testing.T) {
		for _, m := range []string{http.MethodPut, http.MethodPatch, http.MethodDelete, "CHARGE"} {
			s := newServer(t, drop, answer(200))
			tr, _ := newTransport(t)
			resp, _ := mustSend(t, tr, m, s.URL, "x")
			oneKey(t, s.Seen())
			if n := len(s.Seen()); n != 2 || Attempts(resp) != 2 {
				t.Errorf("%s: %d requests, Attempts %d, want 2", m, n, Attempts(resp))
			}
		}
	}},
	{"SafeMethodsUntouched", "GET, HEAD, OPTIONS and TRACE are sent once, without a key, whatever the answer.", func(t *testing.T) {
		for _, m := range []string{http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace} {
			s := newServer(t, answer(503, "Retry-After", "1"))
			tr, _ := newTransport(t)
			resp, _ := mustSend(t, tr, m, s.URL, "")
			seen := s.Seen()
			if len(seen) != 1 || len(seen[0].keys) != 0 || Attempts(resp) != 0 {
				t.Errorf("%s: %d requests, keys %q, Attempts %d; want 1, none, 0", m, len(seen), seen[0].keys, Attempts(resp))
			}
		}
	}},
	{"SameKeyEveryAttempt", "Every attempt of a request carries the first attempt's key and the same body.", func(t *testing.T) {
		s := newServer(t, drop, answer(409, "Retry-After", "1"), answer(503, "Retry-After", "1"), answer(201))
		tr, _ := newTransport(t)
		resp, body := mustSend(t, tr, http.MethodPost, s.URL, `{"item":"tea"}`)
		seen := s.Seen()
		k := oneKey(t, seen)
		for i, sn := range seen {
			if sn.body != `{"item":"tea"}` {
				t.Errorf("attempt %d sent body %q", i+1, sn.body)
			}
		}
		if resp.StatusCode != 201 || body != "201 to attempt 4" || Attempts(resp) != 4 || Key(resp) != k {
			t.Errorf("answer %d %q, Attempts %d, Key %q; want 201 after 4 attempts with %q", resp.StatusCode, body, Attempts(resp), Key(resp), k)
		}
	}},
	{"RetryNetworkError", "A connection closed before the answer is retried after the backoff.", func(t *testing.T) {
		s := newServer(t, drop, answer(201))
		tr, c := newTransport(t)
		resp, _ := mustSend(t, tr, http.MethodPost, s.URL, "x")
		if resp.StatusCode != 201 || len(s.Seen()) != 2 || !slices.Equal(c.Waits(), []time.Duration{DefaultBackoffBase}) {
			t.Errorf("%d after %d requests, waits %v; want 201 after 2, waits [%s]", resp.StatusCode, len(s.Seen()), c.Waits(), DefaultBackoffBase)
		}
	}},
	{"RetryAttemptTimeout", "An attempt without response headers within the attempt timeout is abandoned and retried with the same key.", func(t *testing.T) {
		s := newServer(t, hang, answer(201))
		tr, _ := newTransport(t, WithAttemptTimeout(300*time.Millisecond))
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		resp, _, err := send(t, tr, ctx, http.MethodPost, s.URL, "x")
		if err != nil {
			t.Fatal(err)
		}
		oneKey(t, s.Seen())
		// Usually 2 attempts; a third when the loaded machine answered the
		// second too late.
		if resp.StatusCode != 201 || Attempts(resp) < 2 || Attempts(resp) != len(s.Seen()) {
			t.Errorf("%d after %d attempts (%d requests), want 201 after at least 2", resp.StatusCode, Attempts(resp), len(s.Seen()))
		}
	}},
	{"RetryAfterSeconds", "A 409 with Retry-After in seconds is retried after exactly that wait.", func(t *testing.T) {
		s := newServer(t, answer(409, "Retry-After", "3"), answer(201))
		tr, c := newTransport(t)
		resp, _ := mustSend(t, tr, http.MethodPost, s.URL, "x")
		if resp.StatusCode != 201 || !slices.Equal(c.Waits(), []time.Duration{3 * time.Second}) {
			t.Errorf("%d, waits %v; want 201 after a wait of 3s", resp.StatusCode, c.Waits())
		}
	}},
	{"RetryAfterDate", "A 503 with Retry-After as an HTTP date is retried when that date comes.", func(t *testing.T) {
		tr, c := newTransport(t)
		s := newServer(t, func(w http.ResponseWriter, r *http.Request, n int) {
			answer(503, "Retry-After", c.Now().Add(5*time.Second).UTC().Format(http.TimeFormat))(w, r, n)
		}, answer(201))
		resp, _ := mustSend(t, tr, http.MethodPost, s.URL, "x")
		if resp.StatusCode != 201 || !slices.Equal(c.Waits(), []time.Duration{5 * time.Second}) {
			t.Errorf("%d, waits %v; want 201 after a wait of 5s", resp.StatusCode, c.Waits())
		}
	}},
	{"RetryGateway", "A 502 or 504 (a gateway lost the answer) is retried after the backoff, doubling.", func(t *testing.T) {
		s := newServer(t, answer(502), answer(504), answer(201))
		tr, c := newTransport(t)
		resp, _ := mustSend(t, tr, http.MethodPost, s.URL, "x")
		want := []time.Duration{DefaultBackoffBase, 2 * DefaultBackoffBase}
		if resp.StatusCode != 201 || !slices.Equal(c.Waits(), want) {
			t.Errorf("%d, waits %v; want 201 after waits %v", resp.StatusCode, c.Waits(), want)
		}
	}},
	{"NoRetryWithoutRetryAfter", "A 409 or 503 without a valid Retry-After is the handler's own answer: returned at once.", func(t *testing.T) {
		for _, st := range []step{answer(409), answer(503), answer(503, "Retry-After", "soon"), answer(409, "Retry-After", "-1")} {
			s := newServer(t, st, answer(201))
			tr, _ := newTransport(t)
			resp, body := mustSend(t, tr, http.MethodPost, s.URL, "x")
			if resp.StatusCode == 201 || len(s.Seen()) != 1 || !strings.HasSuffix(body, "to attempt 1") {
				t.Errorf("%d %q after %d requests (Retry-After %q), want the first answer", resp.StatusCode, body, len(s.Seen()), resp.Header.Get("Retry-After"))
			}
		}
	}},
	{"NoRetry4xx", "400, 401, 404, 408, 413, 422 and 429 are returned at once, even with Retry-After.", func(t *testing.T) {
		for _, code := range []int{400, 401, 404, 408, 413, 422, 429} {
			s := newServer(t, answer(code, "Retry-After", "1"), answer(201))
			tr, _ := newTransport(t)
			resp, _ := mustSend(t, tr, http.MethodPost, s.URL, "x")
			if resp.StatusCode != code || len(s.Seen()) != 1 {
				t.Errorf("%d: got %d after %d requests, want it after 1", code, resp.StatusCode, len(s.Seen()))
			}
		}
	}},
	{"NoRetry500", "A 500 (a failed handler, or a recorded outcome-unknown replay) is returned at once, even with Retry-After.", func(t *testing.T) {
		for _, replayed := range []string{"true", "false"} {
			s := newServer(t, answer(500, "Retry-After", "1", HeaderReplayed, replayed), answer(201))
			tr, _ := newTransport(t)
			resp, _ := mustSend(t, tr, http.MethodPost, s.URL, "x")
			if resp.StatusCode != 500 || len(s.Seen()) != 1 || Replayed(resp) != (replayed == "true") {
				t.Errorf("got %d after %d requests (replayed %v), want the 500 (replayed %s) after 1", resp.StatusCode, len(s.Seen()), Replayed(resp), replayed)
			}
		}
	}},
	{"NoRetryReplayed", "A replayed answer (Idempotent-Replayed: true) is the server's record of an earlier attempt, not a lost answer: returned at once, even a 502, 504, or a 409 or 503 with Retry-After.", func(t *testing.T) {
		for _, st := range []step{
			answer(502, HeaderReplayed, "true"), answer(504, HeaderReplayed, "true"),
			answer(409, HeaderReplayed, "true", "Retry-After", "1"), answer(503, HeaderReplayed, "true", "Retry-After", "1"),
		} {
			s := newServer(t, st, answer(201))
			tr, _ := newTransport(t)
			resp, _ := mustSend(t, tr, http.MethodPost, s.URL, "x")
			if resp.StatusCode == 201 || len(s.Seen()) != 1 || !Replayed(resp) {
				t.Errorf("got %d after %d requests (replayed %v), want the replayed answer after 1", resp.StatusCode, len(s.Seen()), Replayed(resp))
			}
		}
	}},
	{"MaxAttempts", "After WithMaxAttempts attempts the last answer is returned as it is.", func(t *testing.T) {
		s := newServer(t, answer(503, "Retry-After", "1"))
		tr, _ := newTransport(t, WithMaxAttempts(3))
		resp, body := mustSend(t, tr, http.MethodPost, s.URL, "x")
		if resp.StatusCode != 503 || body != "503 to attempt 3" || len(s.Seen()) != 3 || Attempts(resp) != 3 {
			t.Errorf("%d %q after %d requests (Attempts %d), want the third 503", resp.StatusCode, body, len(s.Seen()), Attempts(resp))
		}
	}},
	{"OutlastsDefaultLease", "A default Transport outlasts a default lease (30 s) after a crash on a leased route: through the restart (network errors), the 409s with Retry-After while the dead attempt's lease runs and the lease's own Retry-After, to the takeover's answer, with one key; its budget is time, not a count of attempts.", func(t *testing.T) {
		steps := []step{drop, drop, drop}
		steps = append(steps, repeat(15, answer(409, "Retry-After", "1"))...)
		steps = append(steps, answer(409, "Retry-After", "14"), answer(201))
		s := newServer(t, steps...)
		tr, c := newTransport(t)
		resp, body := mustSend(t, tr, http.MethodPost, s.URL, "x")
		oneKey(t, s.Seen())
		if resp.StatusCode != 201 || body != "201 to attempt 20" || Attempts(resp) != 20 {
			t.Errorf("%d %q after %d attempts, want the takeover's 201 after 20", resp.StatusCode, body, Attempts(resp))
		}
		if w := sum(c.Waits()); w < 30*time.Second {
			t.Errorf("waited %s in all, want at least the lease (30s)", w)
		}
	}},
	{"RestartRefused", "Across a restart of a few seconds (every connection refused), a default Transport keeps retrying with the backoff and gets the answer.", func(t *testing.T) {
		s := newServer(t, answer(201))
		tr, c := newTransport(t)
		back := c.Now().Add(5 * time.Second) // the service listens again 5 s after the first attempt
		var refused atomic.Int32
		tr.base = &http.Transport{DisableKeepAlives: true, Proxy: nil, DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			if c.Now().Before(back) {
				refused.Add(1)
				return nil, &net.OpError{Op: "dial", Net: network, Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}
			}
			return (&net.Dialer{}).DialContext(ctx, network, addr)
		}}
		resp, _ := mustSend(t, tr, http.MethodPost, s.URL, "x")
		if n := int(refused.Load()); resp.StatusCode != 201 || n < 5 || len(s.Seen()) != 1 || Attempts(resp) != n+1 {
			t.Errorf("%d after %d attempts (%d refused, %d reached the server), want 201 after every refused one", resp.StatusCode, Attempts(resp), n, len(s.Seen()))
		}
	}},
	{"MaxElapsedBinds", "WithMaxElapsed is the budget: raised to 5 minutes, a key busy for 3 minutes (409 + Retry-After: 1) is retried until its answer; no count of attempts runs out first.", func(t *testing.T) {
		s := newServer(t, append(repeat(180, answer(409, "Retry-After", "1")), answer(201))...)
		tr, _ := newTransport(t, WithMaxElapsed(5*time.Minute))
		resp, _ := mustSend(t, tr, http.MethodPost, s.URL, "x")
		if resp.StatusCode != 201 || Attempts(resp) != 181 {
			t.Errorf("%d after %d attempts, want 201 after 181", resp.StatusCode, Attempts(resp))
		}
	}},
	{"RetryAfterZero", "A Retry-After of 0 or a date in the past waits the backoff: with time as the only bound, a server that keeps saying \"now\" is not hammered.", func(t *testing.T) {
		tr, c := newTransport(t)
		s := newServer(t, answer(503, "Retry-After", "0"), func(w http.ResponseWriter, r *http.Request, n int) {
			answer(409, "Retry-After", c.Now().Add(-time.Minute).UTC().Format(http.TimeFormat))(w, r, n)
		}, answer(201))
		resp, _ := mustSend(t, tr, http.MethodPost, s.URL, "x")
		want := []time.Duration{DefaultBackoffBase, 2 * DefaultBackoffBase}
		if resp.StatusCode != 201 || !slices.Equal(c.Waits(), want) {
			t.Errorf("%d, waits %v; want 201 after the backoff's waits %v", resp.StatusCode, c.Waits(), want)
		}
	}},
	{"MaxElapsed", "No wait runs past WithMaxElapsed from the first attempt: the last answer is returned at once, its body intact.", func(t *testing.T) {
		s := newServer(t, answer(409, "Retry-After", "10"))
		tr, c := newTransport(t, WithMaxElapsed(15*time.Second))
		resp, body := mustSend(t, tr, http.MethodPost, s.URL, "x")
		if resp.StatusCode != 409 || body != "409 to attempt 2" || !slices.Equal(c.Waits(), []time.Duration{10 * time.Second}) {
			t.Errorf("%d %q, waits %v; want the second 409 after one wait of 10s", resp.StatusCode, body, c.Waits())
		}
	}},
	{"ContextDeadline", "A wait that would end after the request's deadline is not started: the last answer is returned at once.", func(t *testing.T) {
		s := newServer(t, answer(409, "Retry-After", "2"), answer(409, "Retry-After", "10"), answer(201))
		tr, c := newTransport(t)
		ctx, cancel := context.WithDeadline(context.Background(), c.Now().Add(5*time.Second))
		defer cancel()
		resp, body, err := send(t, tr, ctx, http.MethodPost, s.URL, "x")
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != 409 || body != "409 to attempt 2" || !slices.Equal(c.Waits(), []time.Duration{2 * time.Second}) {
			t.Errorf("%d %q, waits %v; want the second 409 after one wait of 2s", resp.StatusCode, body, c.Waits())
		}
	}},
	{"ContextEndsDuringWait", "When the request's context ends during a wait, no further attempt is made, and the error carries the key.", func(t *testing.T) {
		s := newServer(t, answer(409, "Retry-After", "1"), answer(201))
		tr, c := newTransport(t)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		c.onSleep = cancel
		_, _, err := send(t, tr, ctx, http.MethodPost, s.URL, "x")
		var e *Error
		if !errors.As(err, &e) || !errors.Is(err, context.Canceled) {
			t.Fatalf("error %v, want an *Error with context.Canceled", err)
		}
		if k := oneKey(t, s.Seen()); len(s.Seen()) != 1 || e.Key != k || e.Attempts != 1 {
			t.Errorf("%d requests, error's key %q attempts %d; want 1 request, key %q, 1 attempt", len(s.Seen()), e.Key, e.Attempts, k)
		}
	}},
	{"ContextEndsDuringAttempt", "An attempt that fails because the request's context ended is not retried.", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		s := newServer(t, func(w http.ResponseWriter, r *http.Request, n int) { cancel(); hang(w, r, n) }, answer(201))
		tr, c := newTransport(t)
		_, _, err := send(t, tr, ctx, http.MethodPost, s.URL, "x")
		if !errors.Is(err, context.Canceled) || len(s.Seen()) != 1 || len(c.Waits()) != 0 {
			t.Errorf("error %v after %d requests and waits %v, want context.Canceled after 1 and no wait", err, len(s.Seen()), c.Waits())
		}
	}},
	{"Backoff", "Without Retry-After the n-th retry waits a uniform random time in [0, min(max, base·2^(n-1))].", func(t *testing.T) {
		s := newServer(t, drop)
		tr, c := newTransport(t, WithMaxAttempts(7), WithBackoff(100*time.Millisecond, time.Second))
		var mu sync.Mutex
		var ranges []time.Duration
		tr.jitter = func(n int64) int64 {
			mu.Lock()
			ranges = append(ranges, time.Duration(n))
			mu.Unlock()
			return n / 2
		}
		_, _, err := send(t, tr, context.Background(), http.MethodPost, s.URL, "x")
		if err == nil {
			t.Fatal("no error after 7 dropped attempts")
		}
		ms := time.Millisecond
		want := []time.Duration{100*ms + 1, 200*ms + 1, 400*ms + 1, 800*ms + 1, 1000*ms + 1, 1000*ms + 1}
		if !slices.Equal(ranges, want) {
			t.Errorf("ranges %v, want %v", ranges, want)
		}
		for i, w := range c.Waits() {
			if w != ranges[i]/2 {
				t.Errorf("wait %d: %s, want the jitter's %s", i+1, w, ranges[i]/2)
			}
		}
	}},
	{"GetBodyResent", "A body with GetBody is sent again through GetBody.", func(t *testing.T) {
		s := newServer(t, drop, answer(201))
		tr, _ := newTransport(t)
		calls := 0
		req, _ := http.NewRequest(http.MethodPost, s.URL, strings.NewReader("payload"))
		req.GetBody = func() (io.ReadCloser, error) { calls++; return io.NopCloser(strings.NewReader("payload")), nil }
		resp, _, err := do(t, tr, req)
		if err != nil {
			t.Fatal(err)
		}
		seen := s.Seen()
		if resp.StatusCode != 201 || len(seen) != 2 || seen[1].body != "payload" || calls != 1 {
			t.Errorf("%d after %d requests, second body %q, GetBody called %d times; want 201, 2, payload, 1", resp.StatusCode, len(seen), seen[len(seen)-1].body, calls)
		}
	}},
	{"BufferedBody", "A body without GetBody, up to WithMaxBufferedBody, is kept and sent again.", func(t *testing.T) {
		s := newServer(t, drop, answer(201))
		tr, _ := newTransport(t, WithMaxBufferedBody(7))
		req, _ := http.NewRequest(http.MethodPost, s.URL, io.NopCloser(strings.NewReader("payload")))
		resp, _, err := do(t, tr, req)
		if err != nil {
			t.Fatal(err)
		}
		seen := s.Seen()
		if resp.StatusCode != 201 || len(seen) != 2 || seen[0].body != "payload" || seen[1].body != "payload" {
			t.Errorf("%d after %d requests, bodies %+v; want 201 after 2 with payload", resp.StatusCode, len(seen), seen)
		}
	}},
	{"LongBodySentOnce", "A body without GetBody over WithMaxBufferedBody is sent whole, once, and not retried.", func(t *testing.T) {
		s := newServer(t, answer(503, "Retry-After", "1"), answer(201))
		tr, _ := newTransport(t, WithMaxBufferedBody(10))
		long := strings.Repeat("0123456789", 100)
		req, _ := http.NewRequest(http.MethodPost, s.URL, io.NopCloser(strings.NewReader(long)))
		resp, _, err := do(t, tr, req)
		if err != nil {
			t.Fatal(err)
		}
		seen := s.Seen()
		if resp.StatusCode != 503 || len(seen) != 1 || seen[0].body != long {
			t.Errorf("%d after %d requests (first body %d bytes); want 503 after 1 with %d bytes", resp.StatusCode, len(seen), len(seen[0].body), len(long))
		}
	}},
	{"ErrorCarriesKey", "When every attempt fails, the error is an *Error with the key all attempts carried and their number, found through http.Client's *url.Error.", func(t *testing.T) {
		s := newServer(t, drop)
		tr, _ := newTransport(t, WithMaxAttempts(3))
		_, _, err := send(t, tr, context.Background(), http.MethodPost, s.URL, "x")
		var e *Error
		if !errors.As(err, &e) {
			t.Fatalf("error %v (%T), want an *Error inside", err, err)
		}
		if k := oneKey(t, s.Seen()); e.Key != k || e.Attempts != 3 || len(s.Seen()) != 3 {
			t.Errorf("Key %q Attempts %d after %d requests; want %q, 3, 3", e.Key, e.Attempts, len(s.Seen()), k)
		}
	}},
	{"CertificateNotRetried", "A refused server certificate is not retried: it would be refused again.", func(t *testing.T) {
		s := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
		s.Config.ErrorLog = discardLog()
		s.StartTLS()
		defer s.Close()
		tr, c := newTransport(t)
		_, _, err := send(t, tr, context.Background(), http.MethodPost, s.URL, "x")
		var e *Error
		if !errors.As(err, &e) || e.Attempts != 1 || len(c.Waits()) != 0 {
			t.Errorf("error %v, waits %v; want an *Error after 1 attempt", err, c.Waits())
		}
	}},
	{"Replayed", "Replayed is true exactly when the answer carries Idempotent-Replayed: true.", func(t *testing.T) {
		s := newServer(t, answer(201, HeaderReplayed, "true"), answer(201), answer(201, HeaderReplayed, "false"))
		tr, _ := newTransport(t)
		for i, want := range []bool{true, false, false} {
			if resp, _ := mustSend(t, tr, http.MethodPost, s.URL, "x"); Replayed(resp) != want {
				t.Errorf("answer %d: Replayed %v, want %v", i+1, Replayed(resp), want)
			}
		}
	}},
	{"OnRetry", "WithOnRetry is told of every retry: the key, the attempt, its status or error, and the wait.", func(t *testing.T) {
		s := newServer(t, drop, answer(409, "Retry-After", "2"), answer(201))
		var got []Retry
		tr, _ := newTransport(t, WithOnRetry(func(r Retry) { got = append(got, r) }))
		mustSend(t, tr, http.MethodPost, s.URL, "x")
		k := oneKey(t, s.Seen())
		if len(got) != 2 {
			t.Fatalf("%d calls, want 2: %+v", len(got), got)
		}
		if r := got[0]; r.Key != k || r.Attempt != 1 || r.Status != 0 || r.Err == nil || r.Wait != DefaultBackoffBase || r.Request == nil {
			t.Errorf("first call %+v, want attempt 1, an error, wait %s, key %s", r, DefaultBackoffBase, k)
		}
		if r := got[1]; r.Key != k || r.Attempt != 2 || r.Status != 409 || r.Err != nil || r.Wait != 2*time.Second {
			t.Errorf("second call %+v, want attempt 2, 409, wait 2s, key %s", r, k)
		}
	}},
	{"Concurrent", "One Transport serves concurrent requests, each with its own key on all its attempts.", func(t *testing.T) {
		var mu sync.Mutex
		tries := map[string]int{}
		s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			tries[r.Header.Get(HeaderKey)]++
			n := tries[r.Header.Get(HeaderKey)]
			mu.Unlock()
			if n == 1 {
				answer(503, "Retry-After", "0")(w, r, n)
				return
			}
			answer(201)(w, r, n)
		}))
		defer s.Close()
		tr, _ := newTransport(t)
		var wg sync.WaitGroup
		for range 20 {
			wg.Go(func() {
				resp, _, err := send(t, tr, context.Background(), http.MethodPost, s.URL, "x")
				if err != nil || resp.StatusCode != 201 || Attempts(resp) != 2 {
					t.Errorf("%v %v", resp, err)
				}
			})
		}
		wg.Wait()
		if len(tries) != 20 {
			t.Errorf("%d keys for 20 requests", len(tries))
		}
		for k, n := range tries {
			if n != 2 {
				t.Errorf("key %s: %d requests, want 2", k, n)
			}
		}
	}},
}

func TestRules(t *testing.T) {
	for _, r := range rules {
		t.Run(r.name, func(t *testing.T) {
			t.Parallel()
			t.Cleanup(func() {
				if t.Failed() {
					t.Logf("rule: %s", r.rule)
				}
			})
			r.run(t)
		})
	}
}
