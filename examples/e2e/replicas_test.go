package e2e

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/http/httptrace"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"
)

// replicaSetups: three identical processes per database server. Issue 8
// asks for Postgres and MariaDB; the frameworks and stores differ between
// the two so both stores run as replicas.
var replicaSetups = []struct{ db, framework, store string }{
	{"postgres", "gin", "sql"},
	{"mysql", "echo", "gorm"},
	{"postgres", "chi", "pgx"}, // native pgx: the claim probe across processes
}

// replicaSetupsToRun adds, in the long variant, the other store on each
// database.
func replicaSetupsToRun() []struct{ db, framework, store string } {
	if !*long {
		return replicaSetups
	}
	out := append([]struct{ db, framework, store string }(nil), replicaSetups...)
	for _, rs := range replicaSetups {
		if rs.store == "pgx" {
			continue
		}
		rs.framework = "chi"
		rs.store = map[string]string{"sql": "gorm", "gorm": "sql"}[rs.store]
		out = append(out, rs)
	}
	return out
}

const replicas = 3

// startReplicas starts n processes of c on one database behind a
// round-robin balancer. The first one starts alone and creates the schema;
// the others start together (see TestReplicasStartTogether for n at once on
// an empty database).
func startReplicas(t *testing.T, c config, n int) ([]*server, *balancer) {
	t.Helper()
	if len(c.db.nodeDSNs) > 0 && n == len(c.db.nodeDSNs) {
		return startReplicasOnNodes(t, c)
	}
	procs := []*server{startServer(t, "replica-0", c)}
	for i := 1; i < n; i++ {
		procs = append(procs, launch(t, t, fmt.Sprintf("replica-%d", i), c))
	}
	addrs := []string{procs[0].addr}
	for _, p := range procs[1:] {
		p.waitReady(t)
		addrs = append(addrs, p.addr)
	}
	return procs, newBalancer(t, addrs...)
}

// send sends one request through the balancer on a new connection and
// reports which backend served it (-1 if none did).
func (b *balancer) send(method, path, account, key, body string) (answer, int, error) {
	var mu sync.Mutex
	local := ""
	ctx := httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{
		GotConn: func(info httptrace.GotConnInfo) {
			mu.Lock()
			local = info.Conn.LocalAddr().String()
			mu.Unlock()
		},
	})
	a, err := do(ctx, freshClient, method, "http://"+b.addr()+path, account, key, body)
	mu.Lock()
	defer mu.Unlock()
	return a, b.backendOf(local), err
}

// sendAsync is send in the background; the backend is known (on backend)
// as soon as the balancer has connected, long before the answer.
func (b *balancer) sendAsync(method, path, account, key, body string) (<-chan int, <-chan result) {
	backend := make(chan int, 1)
	res := make(chan result, 1)
	go func() {
		var once sync.Once
		ctx := httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{
			GotConn: func(info httptrace.GotConnInfo) {
				local := info.Conn.LocalAddr().String()
				go func() {
					// The balancer records the backend once it has dialled it.
					for range 500 {
						if i := b.backendOf(local); i >= 0 {
							once.Do(func() { backend <- i })
							return
						}
						time.Sleep(10 * time.Millisecond)
					}
					once.Do(func() { backend <- -1 })
				}()
			},
		})
		a, err := do(ctx, freshClient, method, "http://"+b.addr()+path, account, key, body)
		res <- result{a, err}
	}()
	return backend, res
}

var freshClient = newClient(true)

// TestReplicas is issue 8, item 1: three processes on one database behind a
// round-robin balancer.
func TestReplicas(t *testing.T) {
	for _, rs := range replicaSetupsToRun() {
		t.Run(rs.db+"/"+rs.framework+"/"+rs.store, func(t *testing.T) {
			t.Parallel()
			base := config{framework: rs.framework, store: rs.store}
			t.Run("storm-and-replay", func(t *testing.T) {
				t.Parallel()
				c := base
				c.db = newDatabase(t, rs.db)
				testReplicaStorm(t, c)
			})
			t.Run("sigkill-atomic", func(t *testing.T) {
				t.Parallel()
				c := base
				c.db = newDatabase(t, rs.db)
				c.extra = []string{"-work-delay", workDelay.String()}
				testReplicaKillAtomic(t, c)
			})
			t.Run("sigkill-leased", func(t *testing.T) {
				t.Parallel()
				c := base
				c.db = newDatabase(t, rs.db)
				c.extra = []string{"-work-delay", workDelay.String(), "-lease", lease.String()}
				testReplicaKillLeased(t, c)
			})
			t.Run("sweepers", func(t *testing.T) {
				t.Parallel()
				c := base
				c.db = newDatabase(t, rs.db)
				c.extra = []string{"-retention", sweepRetention.String(), "-sweep-every", "200ms"}
				testReplicaSweepers(t, c)
			})
		})
	}
}

// testReplicaStorm: the 50-way storm spread over the processes, then a
// retry that lands on another process than the one that executed gets the
// replay.
func testReplicaStorm(t *testing.T, c config) {
	procs, b := startReplicas(t, c, replicas)
	testStorm(t, freshClient, "http://"+b.addr(), "storm", stormSize(), false)
	counts := b.connCounts()
	t.Logf("storm connections per process: %v", counts)
	for i, n := range counts {
		if n == 0 {
			t.Errorf("process %d served no connection of the storm", i)
		}
	}
	// The processes are new: every POST /orders so far is the storm's.
	stormRE := regexp.MustCompile(`method=POST path=/orders status=\d+ `)
	executedRE := regexp.MustCompile(`method=POST path=/orders status=201 .*idempotency=executed`)
	lines := func(re *regexp.Regexp) int {
		total := 0
		for _, p := range procs {
			total += len(p.logs.grep(re))
		}
		return total
	}
	// Every request gets one access log line, written after its answer:
	// once all of the storm's are in, the executed ones can be counted.
	waitFor(t, "every storm request's log line", 10*time.Second, func() bool { return lines(stormRE) >= stormSize() })
	if total := lines(executedRE); total != 1 {
		t.Errorf("executed POST /orders over the three logs: %d, want 1", total)
	}

	key, body, account := "cross-"+randomHex(8), orderBody("cross-widget", 1), "crosser"
	first, origin, err := b.send(http.MethodPost, "/orders", account, key, body)
	if err != nil || first.status != http.StatusCreated || first.replayed() || origin < 0 {
		t.Fatalf("first request: %v (backend %d, %v)", first, origin, err)
	}
	others := map[int]bool{}
	for try := 0; try < 3*replicas && len(others) < replicas-1; try++ {
		a, served, err := b.send(http.MethodPost, "/orders", account, key, body)
		if err != nil {
			t.Fatalf("retry: %v", err)
		}
		if a.status != http.StatusCreated || !a.replayed() || !bytes.Equal(a.body, first.body) {
			t.Errorf("retry on process %d: %v, want the replay of %q", served, a, first.body)
		}
		if served != origin {
			others[served] = true
		}
	}
	if len(others) != replicas-1 {
		t.Errorf("retries landed on processes %v other than the origin %d, want all %d others", others, origin, replicas-1)
	}
	t.Logf("executed on process %d, replayed by processes %v", origin, others)
	if list := listOrders(t, "http://"+b.addr(), account); len(list) != 1 {
		t.Errorf("GET /orders: %d orders, want 1", len(list))
	}
}

// testReplicaKillAtomic: SIGKILL of a process holding POST /orders inside
// its transaction; the retry lands on a surviving process and runs:
// exactly one order.
//
// The killed process is a fourth one on the same database, sent the
// request directly, whose work never ends (see stuckInWork): it is
// certain to die inside its transaction. The survivors are the three
// replicas behind the balancer.
func testReplicaKillAtomic(t *testing.T, c config) {
	_, b := startReplicas(t, c, replicas)
	victim := startServer(t, "victim", stuckInWork(c))
	key, body, account := "rkill-"+randomHex(8), orderBody("rkill-widget", 1), "rkiller"
	res := postAsync("http://"+victim.addr, "/orders", account, key, body)
	c.db.waitInTransaction(t, 15*time.Second)
	victim.kill()
	if r := <-res; r.err == nil {
		t.Fatalf("the request survived SIGKILL of its process: %v", r.a)
	}
	var a answer
	var served int
	deadline := time.Now().Add(20 * time.Second)
	for {
		var err error
		a, served, err = b.send(http.MethodPost, "/orders", account, key, body)
		if err == nil && a.status != http.StatusConflict {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("retry: still %v / %v after 20s", a, err)
		}
		time.Sleep(retryAfter(a))
	}
	if served < 0 {
		t.Errorf("the balancer did not report the process that served the retry")
	}
	if a.status != http.StatusCreated || a.replayed() {
		t.Fatalf("retry on process %d: %v, want an executed 201", served, a)
	}
	o := decodeOrder(t, a.body)
	if list := listOrders(t, "http://"+b.addr(), account); len(list) != 1 || list[0].ID != o.ID {
		t.Errorf("GET /orders: %+v, want exactly order %d", list, o.ID)
	}
	if n := c.db.count(t, `SELECT COUNT(*) FROM orders WHERE account = ?`, account); n != 1 {
		t.Errorf("orders in the database: %d, want 1", n)
	}
	t.Logf("killed the process inside the transaction; the retry ran on replica %d", served)
}

// testReplicaKillLeased: SIGKILL of a process inside a leased payment,
// after the provider charged; the surviving processes answer 409 while the
// lease lives, then one of them takes over: one provider charge, one
// recorded charge.
//
// As in testReplicaKillAtomic, the killed process is a fourth one on the
// same database, sent the payment directly, whose work never ends (see
// stuckInWork): it is certain to die between the provider's charge and
// recording it. The survivors are the three replicas behind the balancer.
func testReplicaKillLeased(t *testing.T, c config) {
	procs, b := startReplicas(t, c, replicas)
	victim := startServer(t, "victim", stuckInWork(c))
	account := "rpayer"
	oa, _, err := b.send(http.MethodPost, "/orders", account, "rpay-order", orderBody("boat", 1))
	if err != nil || oa.status != http.StatusCreated {
		t.Fatalf("order: %v %v", oa, err)
	}
	o := decodeOrder(t, oa.body)
	path := fmt.Sprintf("/orders/%d/payments", o.ID)
	key, body := "rpay-"+randomHex(8), `{"amount_cents":4200}`
	res := postAsync("http://"+victim.addr, path, account, key, body)
	// Killed once the provider's charge is committed: the handler is then
	// past the provider call (or returning from it, which leaves the same
	// state behind), inside its -work-delay of an hour.
	waitFor(t, "the provider charge", 15*time.Second, func() bool {
		return c.db.count(t, `SELECT COUNT(*) FROM provider_charges`) > 0
	})
	victim.kill()
	killedAt := time.Now()
	if r := <-res; r.err == nil {
		t.Fatalf("the payment survived SIGKILL of its process: %v", r.a)
	}

	var a answer
	var served int
	busy := map[int]int{} // 409s per process
	deadline := time.Now().Add(30 * time.Second)
	for {
		var err error
		a, served, err = b.send(http.MethodPost, path, account, key, body)
		if err == nil && a.status != http.StatusConflict {
			break
		}
		if err == nil {
			busy[served]++
			if a.header.Get("Retry-After") == "" {
				t.Errorf("409 without Retry-After from process %d", served)
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("retry: still %v / %v after 30s", a, err)
		}
		time.Sleep(retryAfter(a))
	}
	if served < 0 {
		t.Errorf("the balancer did not report the process that served the takeover")
	}
	if a.status != http.StatusCreated {
		t.Fatalf("takeover on process %d: %v, want 201", served, a)
	}
	t.Logf("killed the process during the payment; 409s from the survivors %v; replica %d took over %s after the kill",
		busy, served, time.Since(killedAt).Round(time.Millisecond))
	if n := c.db.count(t, `SELECT COUNT(*) FROM provider_charges`); n != 1 {
		t.Errorf("provider charges: %d, want exactly 1", n)
	}
	if n := c.db.count(t, `SELECT COUNT(*) FROM charges`); n != 1 {
		t.Errorf("charges: %d, want exactly 1", n)
	}
	waitFor(t, "the takeover's log line", 10*time.Second, func() bool { return len(procs[served].logs.grep(takeoverRE)) > 0 })
	again, _, err := b.send(http.MethodPost, path, account, key, body)
	if err != nil || again.status != http.StatusCreated || !again.replayed() || !bytes.Equal(again.body, a.body) {
		t.Errorf("another retry: %v %v, want the replay of %q", again, err, a.body)
	}
}

// sweepRetention is the record lifetime of the sweeper test.
const sweepRetention = 4 * time.Second

// testReplicaSweepers: three processes sweep one table every 200 ms; the
// records of many requests expire together; every one is deleted while
// live requests go on, no sweep and no request fails, no deadlock, the
// business rows stay, and an expired key runs again.
func testReplicaSweepers(t *testing.T, c config) {
	procs, b := startReplicas(t, c, replicas)
	const n = 150
	account, body := "sweeper", orderBody("sweep-widget", 1)
	created := time.Now()
	var wg sync.WaitGroup
	sem := make(chan struct{}, 10)
	for i := range n {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			a, _, err := b.send(http.MethodPost, "/orders", account, fmt.Sprintf("sweep-%03d", i), body)
			if err != nil || a.status != http.StatusCreated {
				t.Errorf("order %d: %v %v", i, a, err)
			}
		})
	}
	wg.Wait()
	took := time.Since(created)
	records := c.db.count(t, `SELECT COUNT(*) FROM idempotency_records`)
	t.Logf("%d orders through the balancer in %s; %d idempotency records", n, took.Round(time.Millisecond), records)
	if took < sweepRetention/2 && records != n {
		t.Errorf("idempotency records right after: %d, want %d (nothing expired yet)", records, n)
	}
	// Live traffic with new keys goes on while the sweepers delete: it
	// must never wait for them or fail.
	stop := make(chan struct{})
	var live sync.WaitGroup
	var liveMu sync.Mutex
	liveN, liveSlowest := 0, time.Duration(0)
	for w := range 2 {
		live.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				t0 := time.Now()
				a, _, err := b.send(http.MethodPost, "/orders", account, fmt.Sprintf("live-%d-%04d", w, i), body)
				d := time.Since(t0)
				if err != nil || a.status != http.StatusCreated || a.replayed() {
					t.Errorf("live request during the sweeps: %v %v, want an executed 201", a, err)
				}
				liveMu.Lock()
				liveN++
				liveSlowest = max(liveSlowest, d)
				liveMu.Unlock()
				time.Sleep(20 * time.Millisecond)
			}
		})
	}
	waitFor(t, "the sweepers deleting the expired records", sweepRetention+20*time.Second, func() bool {
		return c.db.count(t, `SELECT COUNT(*) FROM idempotency_records WHERE idem_key LIKE 'sweep-%'`) == 0
	})
	close(stop)
	live.Wait()
	t.Logf("expired records gone %s after the first one was written; %d live requests meanwhile (slowest %s)",
		time.Since(created).Round(time.Millisecond), liveN, liveSlowest.Round(time.Millisecond))
	waitFor(t, "the sweepers emptying the table", sweepRetention+20*time.Second, func() bool {
		return c.db.count(t, `SELECT COUNT(*) FROM idempotency_records`) == 0
	})
	if got := c.db.count(t, `SELECT COUNT(*) FROM orders`); got != n+liveN {
		t.Errorf("orders: %d, want %d (the sweep deletes idempotency records only)", got, n+liveN)
	}
	bad := regexp.MustCompile(`(?i)sweep failed|deadlock|level=ERROR`)
	for i, p := range procs {
		if lines := p.logs.grep(bad); len(lines) > 0 {
			t.Errorf("process %d logged:\n%s", i, strings.Join(lines, "\n"))
		}
	}
	// An expired record is absent: the same key runs again.
	a, _, err := b.send(http.MethodPost, "/orders", account, "sweep-000", body)
	if err != nil || a.status != http.StatusCreated || a.replayed() {
		t.Errorf("a key after its retention: %v %v, want an executed 201", a, err)
	}
}

// TestReplicasStartTogether starts three processes at the same moment on an
// empty database (a deployment rolling out replicas): every one must come
// up. Several rounds, each on a new database, because the race is narrow.
func TestReplicasStartTogether(t *testing.T) {
	for _, rs := range replicaSetups {
		t.Run(rs.db+"/"+rs.framework+"/"+rs.store, func(t *testing.T) {
			t.Parallel()
			for round := range 5 {
				c := config{framework: rs.framework, store: rs.store, db: newDatabase(t, rs.db)}
				procs := make([]*server, replicas)
				for i := range procs {
					procs[i] = launch(t, t, fmt.Sprintf("round-%d-replica-%d", round, i), c)
				}
				for i, p := range procs {
					if err := p.ready(60 * time.Second); err != nil {
						failed := p.logs.grep(regexp.MustCompile(`level=ERROR`))
						t.Errorf("round %d: replica %d of %d started together did not come up: %s", round, i, replicas, strings.Join(failed, "\n"))
					}
				}
				for _, p := range procs {
					p.kill()
				}
			}
		})
	}
}
