package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"
)

var (
	databases  = []string{"sqlite", "postgres", "mysql"}
	frameworks = []string{"gin", "echo", "chi"}
)

// long selects the long variant: both stores in every cell of the matrix,
// and storms of 200 requests.
var long = flag.Bool("e2e.long", false, "run the long variant of the end-to-end tests (every store in every cell, storms of 200)")

// stormSize is the number of concurrent requests of a storm.
func stormSize() int {
	if *long {
		return 200
	}
	return 50
}

// stormMu lets one storm run at a time (see testStorm).
var stormMu sync.Mutex

// storeFor alternates the store over the matrix, so that every database and
// every framework runs with both stores. TestService adds the pgx store on
// Postgres (one framework; every framework in the long variant).
func storeFor(db, framework int) string {
	if (db+framework)%2 == 0 {
		return "gorm"
	}
	return "sql"
}

// Timing of the crash scenarios: a request sleeps workDelay inside its
// transaction (or, leased, after calling the provider); a payment's lease
// is lease.
// The work outlasts the lease, so a living attempt must extend its lease
// to keep it.
const (
	workDelay = 3 * time.Second
	lease     = 2 * time.Second
)

// TestService runs every scenario of issue 5 against the built binary, for
// every database and framework.
func TestService(t *testing.T) {
	for di, db := range databases {
		for fi, fw := range frameworks {
			stores := []string{storeFor(di, fi)}
			if *long {
				stores = []string{"gorm", "sql"}
			}
			if db == "postgres" && (*long || fi == len(frameworks)-1) {
				stores = append(stores, "pgx") // native pgx: Postgres only
			}
			for _, store := range stores {
				t.Run(db+"/"+fw+"/"+store, func(t *testing.T) {
					t.Parallel()
					testService(t, config{framework: fw, store: store, db: newDatabase(t, db)})
				})
			}
		}
	}
}

func testService(t *testing.T, c config) {
	start := time.Now()
	a := startServer(t, "orders", c)
	base := "http://" + a.addr
	if h := mustDo(t, client, http.MethodGet, base+"/healthz", "", "", ""); h.status != http.StatusOK {
		t.Fatalf("GET /healthz: %v", h)
	}

	t.Run("1-storm", func(t *testing.T) { testStorm(t, client, base, "storm", stormSize(), c.db.kind == "sqlite") })
	t.Run("2-lost-response", func(t *testing.T) { testLostResponse(t, a.addr) })
	t.Run("4-two-accounts", func(t *testing.T) { testTwoAccounts(t, base) })
	t.Run("5-changed-body", func(t *testing.T) { testChangedBody(t, c.db, base) })

	// The order the payment scenario pays for.
	payOrder := decodeOrder(t, mustDo(t, client, http.MethodPost, base+"/orders", "payer", "payer-order", orderBody("bike", 1)).body)
	if code := a.terminate(t); code != 0 {
		t.Errorf("exit code after SIGTERM (idle): %d, want 0", code)
	}

	// Each crash scenario kills a process of its own whose work never ends
	// (stuckInWork); the payment's restarted process is handed on and shut
	// down with SIGTERM.
	slow := c
	slow.extra = []string{"-work-delay", workDelay.String(), "-lease", lease.String()}
	var next *server
	owner := t
	t.Run("3-crash-atomic", func(t *testing.T) { testCrashAtomic(t, slow) })
	t.Run("3-crash-leased", func(t *testing.T) { next = testCrashLeased(t, owner, slow, payOrder.ID) })
	t.Run("graceful-sigterm", func(t *testing.T) { testGracefulShutdown(t, slow, next) })
	t.Logf("%s: all scenarios in %s", c, time.Since(start).Round(time.Millisecond))
}

// testStorm: n concurrent identical POST /orders with one key. Exactly one
// order exists; every answer is the one 201 body (exactly one of them
// executed, the others replayed) or a 409 with Retry-After; a later retry
// gets the replay.
//
// SQLite has one writer at a time: a duplicate waits for the first
// transaction instead of answering 409 (sqlstore's README), and a wait
// longer than busy_timeout (5 s in the example) is a 503 with Retry-After,
// which the contract allows for an unavailable store. On a loaded machine
// 50 queued writers can pass that bound, so on SQLite (sqlite true) a 503
// store-unavailable problem with Retry-After is accepted too; its client
// then retries and must get the replay.
func testStorm(t *testing.T, c *http.Client, base, account string, n int, sqlite bool) {
	key, body := "storm-"+randomHex(8), orderBody("storm-widget", 3)
	answers := make([]answer, n)
	errs := make([]error, n)
	lat := make([]time.Duration, n)
	var wg sync.WaitGroup
	gate := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-gate
			t0 := time.Now()
			answers[i], errs[i] = do(context.Background(), c, http.MethodPost, base+"/orders", account, key, body)
			lat[i] = time.Since(t0)
		})
	}
	// One storm at a time in the whole suite: the storms are the only
	// part that needs the CPU, and the others wait for timers.
	stormMu.Lock()
	t0 := time.Now()
	close(gate)
	wg.Wait()
	took := time.Since(t0)
	stormMu.Unlock()

	var first []byte
	executed, replayed, busy, unavailable := 0, 0, 0, 0
	var slowest409 time.Duration
	for i, a := range answers {
		if errs[i] != nil {
			t.Errorf("request %d: %v", i, errs[i])
			continue
		}
		switch a.status {
		case http.StatusCreated:
			if first == nil {
				first = a.body
			} else if !bytes.Equal(a.body, first) {
				t.Errorf("request %d: 201 with another body:\n%s\nfirst:\n%s", i, a.body, first)
			}
			if a.replayed() {
				replayed++
			} else {
				executed++
			}
		case http.StatusConflict:
			busy++
			slowest409 = max(slowest409, lat[i])
			if a.header.Get("Retry-After") == "" {
				t.Errorf("request %d: 409 without Retry-After: %v", i, a)
			}
			if ct := a.header.Get("Content-Type"); !strings.HasPrefix(ct, "application/problem+json") {
				t.Errorf("request %d: 409 with Content-Type %q", i, ct)
			}
		case http.StatusServiceUnavailable:
			if !sqlite || a.header.Get("Retry-After") == "" || !bytes.Contains(a.body, []byte("store-unavailable")) {
				t.Errorf("request %d: %v, want 201 or 409", i, a)
				continue
			}
			unavailable++
		default:
			t.Errorf("request %d: %v, want 201 or 409", i, a)
		}
	}
	if executed != 1 {
		t.Errorf("%d answers executed the handler (201 without Idempotent-Replayed), want exactly 1", executed)
	}
	t.Logf("storm of %d in %s: %d executed, %d replayed, %d in progress (409; slowest %s), %d store unavailable (503, SQLite busy_timeout; retried: replay)",
		n, took.Round(time.Millisecond), executed, replayed, busy, slowest409.Round(time.Millisecond), unavailable)
	if first == nil {
		t.Fatal("no 201 at all")
	}
	for range unavailable {
		r, _ := retryUntilSettled(t, c, http.MethodPost, base+"/orders", account, key, body, 30*time.Second)
		if r.status != http.StatusCreated || !r.replayed() || !bytes.Equal(r.body, first) {
			t.Errorf("a client that got 503 retried: %v, want the replay of %q", r, first)
		}
	}
	o := decodeOrder(t, first)
	if got := listOrders(t, base, account); len(got) != 1 || got[0].ID != o.ID {
		t.Errorf("GET /orders: %+v, want exactly order %d", got, o.ID)
	}
	again := mustDo(t, c, http.MethodPost, base+"/orders", account, key, body)
	if again.status != http.StatusCreated || !again.replayed() || !bytes.Equal(again.body, first) {
		t.Errorf("later retry: %v, want the 201 replay of %q", again, first)
	}
}

// testLostResponse: the server commits and answers, the proxy drops the
// answer and resets the client's connection; the client retries with the
// same key and ends with the body the server had sent, and one order.
func testLostResponse(t *testing.T, target string) {
	p := newLossyProxy(t, target)
	base := "http://" + p.addr()
	c := newClient(true)
	key, body, account := "lost-"+randomHex(8), orderBody("lost-widget", 2), "lost"

	p.cutNext.Store(true)
	var final answer
	transportErrors := 0
	for try := 1; ; try++ {
		a, err := do(context.Background(), c, http.MethodPost, base+"/orders", account, key, body)
		if err == nil {
			final = a
			break
		}
		transportErrors++
		if try == 5 {
			t.Fatalf("still failing after %d tries: %v", try, err)
		}
		t.Logf("try %d: %v (retrying with the same key)", try, err)
	}
	var lost lostResponse
	select {
	case lost = <-p.lost:
	case <-time.After(10 * time.Second):
		t.Fatal("the proxy cut no connection")
	}
	if lost.err != nil {
		t.Fatalf("the proxy could not read the server's answer: %v", lost.err)
	}
	if transportErrors != 1 {
		t.Errorf("the client saw %d transport errors, want 1 (the cut)", transportErrors)
	}
	if lost.status != http.StatusCreated {
		t.Fatalf("the lost answer was %d %q, want 201", lost.status, lost.body)
	}
	if final.status != http.StatusCreated || !final.replayed() || !bytes.Equal(final.body, lost.body) {
		t.Errorf("retry: %v, want the replay of the lost answer %q", final, lost.body)
	}
	if final.header.Get("Location") != lost.header.Get("Location") {
		t.Errorf("retry: Location %q, lost answer had %q", final.header.Get("Location"), lost.header.Get("Location"))
	}
	o := decodeOrder(t, lost.body)
	if got := listOrders(t, base, account); len(got) != 1 || got[0].ID != o.ID {
		t.Errorf("GET /orders: %+v, want exactly order %d", got, o.ID)
	}
}

// testTwoAccounts: two accounts send the same key (with different bodies,
// which would be a 422 if they shared a key space): two orders, and each
// account only ever sees its own.
func testTwoAccounts(t *testing.T, base string) {
	key := "shared-" + randomHex(8)
	accounts := []string{"alice", "bob"}
	bodies := map[string]string{"alice": orderBody("alice-lamp", 1), "bob": orderBody("bob-chair", 4)}
	got := map[string]answer{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, acc := range accounts {
		wg.Go(func() {
			a, err := do(context.Background(), client, http.MethodPost, base+"/orders", acc, key, bodies[acc])
			if err != nil {
				t.Errorf("%s: %v", acc, err)
			}
			mu.Lock()
			got[acc] = a
			mu.Unlock()
		})
	}
	wg.Wait()
	ids := map[int64]string{}
	for _, acc := range accounts {
		a := got[acc]
		if a.status != http.StatusCreated || a.replayed() {
			t.Fatalf("%s: %v, want an executed 201", acc, a)
		}
		o := decodeOrder(t, a.body)
		if o.Account != acc {
			t.Errorf("%s got an order of %q: %s", acc, o.Account, a.body)
		}
		if other, dup := ids[o.ID]; dup {
			t.Errorf("%s and %s got the same order %d", acc, other, o.ID)
		}
		ids[o.ID] = acc
		again := mustDo(t, client, http.MethodPost, base+"/orders", acc, key, bodies[acc])
		if again.status != http.StatusCreated || !again.replayed() || !bytes.Equal(again.body, a.body) {
			t.Errorf("%s: replay %v, want its own %q", acc, again, a.body)
		}
		if list := listOrders(t, base, acc); len(list) != 1 || list[0].ID != o.ID || list[0].Account != acc {
			t.Errorf("%s: GET /orders %+v, want only its order %d", acc, list, o.ID)
		}
	}
}

// testChangedBody: another body under a used key is a 422 problem and
// creates nothing; the original body still replays.
func testChangedBody(t *testing.T, d *database, base string) {
	key, account := "changed-"+randomHex(8), "carol"
	first := mustDo(t, client, http.MethodPost, base+"/orders", account, key, orderBody("pen", 1))
	if first.status != http.StatusCreated {
		t.Fatalf("first: %v", first)
	}
	before := d.count(t, `SELECT COUNT(*) FROM orders`)
	a := mustDo(t, client, http.MethodPost, base+"/orders", account, key, orderBody("pen", 2))
	if a.status != http.StatusUnprocessableEntity {
		t.Fatalf("changed body: %v, want 422", a)
	}
	if ct := a.header.Get("Content-Type"); !strings.HasPrefix(ct, "application/problem+json") {
		t.Errorf("422 Content-Type %q, want application/problem+json", ct)
	}
	var prob struct {
		Type   string `json:"type"`
		Title  string `json:"title"`
		Status int    `json:"status"`
	}
	if err := json.Unmarshal(a.body, &prob); err != nil || prob.Status != 422 || prob.Type == "" || prob.Title == "" {
		t.Errorf("422 body is not a problem document: %q (%v)", a.body, err)
	}
	if a.replayed() {
		t.Error("422 marked Idempotent-Replayed")
	}
	if after := d.count(t, `SELECT COUNT(*) FROM orders`); after != before {
		t.Errorf("orders in the database: %d after the 422, %d before", after, before)
	}
	if list := listOrders(t, base, account); len(list) != 1 {
		t.Errorf("GET /orders: %d orders, want 1", len(list))
	}
	again := mustDo(t, client, http.MethodPost, base+"/orders", account, key, orderBody("pen", 1))
	if again.status != http.StatusCreated || !again.replayed() || !bytes.Equal(again.body, first.body) {
		t.Errorf("original body again: %v, want the replay of %q", again, first.body)
	}
}

// postAsync sends a request in the background.
func postAsync(base, path, account, key, body string) <-chan result {
	ch := make(chan result, 1)
	go func() {
		a, err := do(context.Background(), newClient(true), http.MethodPost, base+path, account, key, body)
		ch <- result{a, err}
	}()
	return ch
}

type result struct {
	a   answer
	err error
}

// testGracefulShutdown: SIGTERM while a request is inside its transaction:
// the request completes (201), the process exits 0, the order exists.
func testGracefulShutdown(t *testing.T, c config, s *server) {
	if s == nil {
		s = startServer(t, "orders-sigterm", c)
	}
	base := "http://" + s.addr
	key, body, account := "term-"+randomHex(8), orderBody("term-widget", 1), "terminator"
	res := postAsync(base, "/orders", account, key, body)
	c.db.waitInTransaction(t, 15*time.Second)
	t0 := time.Now()
	code := s.terminate(t)
	r := <-res
	if r.err != nil {
		t.Fatalf("in-flight request during SIGTERM: %v", r.err)
	}
	if r.a.status != http.StatusCreated {
		t.Fatalf("in-flight request during SIGTERM: %v, want 201", r.a)
	}
	if code != 0 {
		t.Errorf("exit code after SIGTERM: %d, want 0", code)
	}
	t.Logf("SIGTERM: the in-flight request completed, exit %d after %s", code, time.Since(t0).Round(time.Millisecond))
	o := decodeOrder(t, r.a.body)
	if n := c.db.count(t, `SELECT COUNT(*) FROM orders WHERE id = ? AND account = ?`, o.ID, account); n != 1 {
		t.Errorf("order %d in the database: %d rows, want 1", o.ID, n)
	}
}

// testCrashAtomic: SIGKILL while POST /orders is inside its transaction;
// after a restart on the same database the retry runs (the first attempt
// was rolled back): exactly one order. The killed process's work never
// ends (stuckInWork); the restarted one has c's, and is stopped with
// SIGTERM at the end.
func testCrashAtomic(t *testing.T, c config) {
	s := startServer(t, "orders-crash-1", stuckInWork(c))
	key, body, account := "crash-"+randomHex(8), orderBody("crash-widget", 1), "crasher"
	res := postAsync("http://"+s.addr, "/orders", account, key, body)
	c.db.waitInTransaction(t, 15*time.Second)
	s.kill()
	if r := <-res; r.err == nil {
		t.Fatalf("the request survived SIGKILL: %v", r.a)
	}
	if n := c.db.count(t, `SELECT COUNT(*) FROM orders WHERE account = ?`, account); n != 0 {
		t.Fatalf("after SIGKILL: %d orders, want 0 (rolled back)", n)
	}
	if n := c.db.count(t, `SELECT COUNT(*) FROM idempotency_records WHERE caller = ?`, account); n != 0 {
		t.Errorf("after SIGKILL: %d idempotency records of %s, want 0 (rolled back)", n, account)
	}

	s2 := startServer(t, "orders-crash-2", c)
	base := "http://" + s2.addr
	a, tries := retryUntilSettled(t, client, http.MethodPost, base+"/orders", account, key, body, 20*time.Second)
	if a.status != http.StatusCreated || a.replayed() {
		t.Fatalf("retry after the restart: %v, want an executed 201", a)
	}
	o := decodeOrder(t, a.body)
	if list := listOrders(t, base, account); len(list) != 1 || list[0].ID != o.ID {
		t.Errorf("GET /orders: %+v, want exactly order %d", list, o.ID)
	}
	if n := c.db.count(t, `SELECT COUNT(*) FROM idempotency_records WHERE caller = ?`, account); n != 1 {
		t.Errorf("idempotency records of %s after the retry: %d, want 1", account, n)
	}
	again := mustDo(t, client, http.MethodPost, base+"/orders", account, key, body)
	if again.status != http.StatusCreated || !again.replayed() || !bytes.Equal(again.body, a.body) {
		t.Errorf("another retry: %v, want the replay of %q", again, a.body)
	}
	t.Logf("atomic crash: retry executed after %d tries; one order (%d)", tries, o.ID)
	if code := s2.terminate(t); code != 0 {
		t.Errorf("exit code after SIGTERM (idle): %d, want 0", code)
	}
}

// stuckInWork is c for a process whose requests never finish their work
// (-work-delay 1h, longer than any test): POST /orders stays inside its
// transaction, a payment stays between the provider's charge and
// recording it. A SIGKILL after waitInTransaction, or after the provider
// charge is seen, is certain to land there. With a finite delay (it was
// workDelay, 3 s), a loaded machine (load ~30) could spend the rest of the
// delay between the probe and the kill: the request finished and
// answered, and the test failed with "the request survived SIGKILL"
// although the service had done what it must.
func stuckInWork(c config) config {
	c.extra = append(append([]string(nil), c.extra...), "-work-delay", "1h")
	return c
}

var takeoverRE = regexp.MustCompile(`path=/orders/\d+/payments status=201 .*idempotency=executed .*attempt=2`)

// testCrashLeased: SIGKILL after the payment provider charged, during the
// handler's sleep; after a restart the retry gets 409 until the lease lapses,
// then takes over and asks the provider again with the same downstream key:
// one provider charge, one recorded charge, a 201.
// The killed process's work never ends (stuckInWork); the restarted one
// has c's. It returns the restarted process, still running.
func testCrashLeased(t *testing.T, owner testing.TB, c config, orderID int64) *server {
	s := startServer(t, "orders-pay-1", stuckInWork(c))
	path := fmt.Sprintf("/orders/%d/payments", orderID)
	key, body, account := "pay-"+randomHex(8), `{"amount_cents":1999}`, "payer"
	res := postAsync("http://"+s.addr, path, account, key, body)
	// Killed once the provider's charge is committed: the handler is then
	// past the provider call (or returning from it, which leaves the same
	// state behind), inside its -work-delay of an hour.
	waitFor(t, "the provider charge", 15*time.Second, func() bool {
		return c.db.count(t, `SELECT COUNT(*) FROM provider_charges`) > 0
	})
	s.kill()
	killedAt := time.Now()
	if r := <-res; r.err == nil {
		t.Fatalf("the payment survived SIGKILL: %v", r.a)
	}
	if n := c.db.count(t, `SELECT COUNT(*) FROM charges`); n != 0 {
		t.Fatalf("after SIGKILL: %d charges recorded, want 0", n)
	}

	s2 := startServerFor(t, owner, "orders-pay-2", c)
	base := "http://" + s2.addr
	a, tries := retryUntilSettled(t, client, http.MethodPost, base+path, account, key, body, 30*time.Second)
	if a.status != http.StatusCreated {
		t.Fatalf("retry after the restart: %v, want 201", a)
	}
	t.Logf("leased crash: the retry took over after %d tries, %s after SIGKILL", tries, time.Since(killedAt).Round(time.Millisecond))
	var ch struct {
		ID               int64  `json:"id"`
		OrderID          int64  `json:"order_id"`
		ProviderChargeID string `json:"provider_charge_id"`
	}
	if err := json.Unmarshal(a.body, &ch); err != nil || ch.OrderID != orderID || ch.ProviderChargeID == "" {
		t.Fatalf("not a charge of order %d: %q (%v)", orderID, a.body, err)
	}
	if n := c.db.count(t, `SELECT COUNT(*) FROM provider_charges`); n != 1 {
		t.Errorf("provider charges: %d, want exactly 1", n)
	}
	if n := c.db.count(t, `SELECT COUNT(*) FROM provider_charges WHERE charge_id = ?`, ch.ProviderChargeID); n != 1 {
		t.Errorf("the charge's provider id %q is not the provider's charge", ch.ProviderChargeID)
	}
	if n := c.db.count(t, `SELECT COUNT(*) FROM charges`); n != 1 {
		t.Errorf("charges: %d, want exactly 1", n)
	}
	// The access log line follows the answer.
	waitFor(t, "the takeover's log line (executed, attempt=2)", 10*time.Second, func() bool { return len(s2.logs.grep(takeoverRE)) > 0 })
	if lines := s2.logs.grep(takeoverRE); len(lines) != 1 {
		t.Errorf("log lines of a takeover (executed, attempt=2): %d, want 1", len(lines))
	}
	again := mustDo(t, client, http.MethodPost, base+path, account, key, body)
	if again.status != http.StatusCreated || !again.replayed() || !bytes.Equal(again.body, a.body) {
		t.Errorf("another retry: %v, want the replay of %q", again, a.body)
	}
	return s2
}
