package e2e

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/idemclient"
)

// newIdemClient is an idemclient over a transport that opens a connection
// per attempt (so that the proxy sees every attempt, and net/http does not
// resend a request on a reused connection by itself).
func newIdemClient(t *testing.T, opts ...idemclient.Option) *http.Client {
	t.Helper()
	base := &http.Transport{DisableKeepAlives: true, Proxy: nil}
	t.Cleanup(base.CloseIdleConnections)
	tr, err := idemclient.NewTransport(base, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return &http.Client{Transport: tr}
}

// post sends body to u as account through c (without a key: the client
// makes one) and reads the answer.
func post(t *testing.T, c *http.Client, u, account, body string) (*http.Response, []byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+account)
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", u, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("POST %s: reading the answer: %v", u, err)
	}
	return resp, b
}

var uuidV4 = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)

// TestClientLostAnswers: idemclient creates an order through a proxy that
// forwards each of the first two attempts, lets the service commit and
// answer, reads that answer, and resets the client's connection without a
// byte of it. The client retries with its key and the same body: one
// order, and the client ends with the first execution's answer (its body
// and Location), replayed, after three attempts.
func TestClientLostAnswers(t *testing.T) {
	t.Parallel()
	c := config{framework: "gin", store: "gorm", db: newDatabase(t, "sqlite")}
	s := startServer(t, "orders", c)
	p := newLossyProxy(t, s.addr)
	p.cuts.Store(2)
	base := "http://" + p.addr()
	account, body := "client-lost", orderBody("lost-answer-widget", 4)

	resp, final := post(t, newIdemClient(t, idemclient.WithBackoff(10*time.Millisecond, 100*time.Millisecond)), base+"/orders", account, body)

	var lost []lostResponse
	for range 2 {
		select {
		case lr := <-p.lost:
			if lr.err != nil {
				t.Fatalf("the proxy could not read the server's answer: %v", lr.err)
			}
			lost = append(lost, lr)
		case <-time.After(10 * time.Second):
			t.Fatalf("the proxy cut %d connections, want 2", len(lost))
		}
	}
	first := lost[0]
	if first.status != http.StatusCreated || first.header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("the first lost answer: %d %q (replayed %q), want the execution's 201", first.status, first.body, first.header.Get("Idempotent-Replayed"))
	}
	if l := lost[1]; l.status != http.StatusCreated || l.header.Get("Idempotent-Replayed") != "true" || !bytes.Equal(l.body, first.body) {
		t.Errorf("the second lost answer: %d %q (replayed %q), want the replay of %q", l.status, l.body, l.header.Get("Idempotent-Replayed"), first.body)
	}
	if resp.StatusCode != http.StatusCreated || !idemclient.Replayed(resp) || !bytes.Equal(final, first.body) {
		t.Errorf("the client ended with %d %q (replayed %v), want the replay of the first answer %q", resp.StatusCode, final, idemclient.Replayed(resp), first.body)
	}
	if got, want := resp.Header.Get("Location"), first.header.Get("Location"); got != want {
		t.Errorf("Location %q, the first answer's %q", got, want)
	}
	if n := idemclient.Attempts(resp); n != 3 {
		t.Errorf("Attempts %d, want 3 (two lost answers, then the replay)", n)
	}
	if k := idemclient.Key(resp); !uuidV4.MatchString(k) {
		t.Errorf("Key %q, want the UUID v4 the client made", k)
	}
	o := decodeOrder(t, first.body)
	if got := listOrders(t, "http://"+s.addr, account); len(got) != 1 || got[0].ID != o.ID {
		t.Errorf("GET /orders: %+v, want exactly order %d", got, o.ID)
	}
	if n := c.db.count(t, `SELECT COUNT(*) FROM orders WHERE item = ?`, "lost-answer-widget"); n != 1 {
		t.Errorf("%d orders in the database, want 1", n)
	}
}

// TestClientPaymentTimeout: idemclient pays through the leased payments
// route while the handler is slow (1.5 s after the provider charged). Its
// first attempt times out (no headers within 300 ms) and is abandoned;
// the service runs it to its end. The retries with the same key get 409 +
// Retry-After while it runs (honoured), then its 201 replayed: one provider
// charge, one charge row.
func TestClientPaymentTimeout(t *testing.T) {
	t.Parallel()
	c := config{framework: "chi", store: "sql", db: newDatabase(t, "sqlite"), extra: []string{"-work-delay", "1500ms"}}
	s := startServer(t, "orders-pay", c)
	base := "http://" + s.addr
	path := payFor(t, base)

	client := newIdemClient(t, idemclient.WithAttemptTimeout(300*time.Millisecond), idemclient.WithMaxAttempts(20), idemclient.WithMaxElapsed(30*time.Second))
	resp, body := post(t, client, base+path, "payer", `{"amount_cents":4200}`)
	if resp.StatusCode != http.StatusCreated || !idemclient.Replayed(resp) {
		t.Fatalf("the payment ended with %d %q (replayed %v), want the first attempt's 201 replayed", resp.StatusCode, body, idemclient.Replayed(resp))
	}
	if n := idemclient.Attempts(resp); n < 3 {
		t.Errorf("Attempts %d, want at least 3 (a timeout, a 409, the replay)", n)
	}
	wantOneCharge(t, c.db, decodeCharge(t, body), 4200)
	inProgress := regexp.MustCompile(`path=` + regexp.QuoteMeta(path) + ` status=409 `)
	if len(s.logs.grep(inProgress)) == 0 {
		t.Errorf("no retry was answered 409 in progress:\n%s", s.logs)
	}
}

// TestClientCrashLeased: idemclient with its defaults pays through the
// leased payments route (a 20 s lease); the service is killed (SIGKILL)
// after the provider charged, inside the handler, and started again on the
// same address 5 s later, every connection refused meanwhile. The client
// retries through the restart, gets 409 until the dead attempt's lease
// lapses, then the answer of the attempt that takes it over (executed,
// attempt 2), all with its one key: one provider charge, one charge row.
// With 5 attempts (the first default) it gave up during the restart.
func TestClientCrashLeased(t *testing.T) {
	t.Parallel()
	c := config{framework: "chi", store: "sql", db: newDatabase(t, "sqlite"), extra: []string{"-lease", "20s"}}
	s0 := startServer(t, "orders", c)
	path := payFor(t, "http://"+s0.addr)
	if code := s0.terminate(t); code != 0 {
		t.Fatalf("exit code after SIGTERM (idle): %d, want 0", code)
	}
	s := startServer(t, "orders-pay-1", stuckInWork(c)) // the payment's work never ends
	base := "http://" + s.addr

	type result struct {
		resp *http.Response
		body []byte
		err  error
		at   time.Time
	}
	res := make(chan result, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+path, strings.NewReader(`{"amount_cents":4200}`))
		req.Header.Set("Authorization", "Bearer payer")
		req.Header.Set("Content-Type", "application/json")
		resp, err := newIdemClient(t).Do(req)
		if err != nil {
			res <- result{err: err, at: time.Now()}
			return
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		res <- result{resp: resp, body: b, err: err, at: time.Now()}
	}()
	waitFor(t, "the provider charge", 15*time.Second, func() bool {
		return c.db.count(t, `SELECT COUNT(*) FROM provider_charges WHERE amount_cents = 4200`) > 0
	})
	s.kill()
	killedAt := time.Now()
	time.Sleep(5 * time.Second) // the restart: connections refused
	restarted := c
	restarted.extra = append(append([]string(nil), c.extra...), "-addr", s.addr) // the same address (the last -addr wins)
	s2 := startServer(t, "orders-pay-2", restarted)
	if s2.addr != s.addr {
		t.Fatalf("restarted on %s, want %s", s2.addr, s.addr)
	}

	r := <-res
	if r.err != nil {
		t.Fatalf("the default client gave up %s after the kill: %v", r.at.Sub(killedAt).Round(time.Millisecond), r.err)
	}
	if r.resp.StatusCode != http.StatusCreated || idemclient.Replayed(r.resp) {
		t.Fatalf("the payment ended with %d %q (replayed %v), want the takeover's 201", r.resp.StatusCode, r.body, idemclient.Replayed(r.resp))
	}
	if k := idemclient.Key(r.resp); !uuidV4.MatchString(k) {
		t.Errorf("Key %q, want the UUID v4 the client made", k)
	}
	wantOneCharge(t, c.db, decodeCharge(t, r.body), 4200)
	waitFor(t, "the takeover's log line (executed, attempt=2)", 10*time.Second, func() bool { return len(s2.logs.grep(takeoverRE)) > 0 })
	busy := s2.logs.grep(regexp.MustCompile(`path=` + regexp.QuoteMeta(path) + ` status=409 `))
	t.Logf("answered %s after the kill, after %d attempts (%d 409s from the restarted service)",
		r.at.Sub(killedAt).Round(time.Millisecond), idemclient.Attempts(r.resp), len(busy))
}
