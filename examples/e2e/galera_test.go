package e2e

import (
	"context"
	"database/sql"
	"fmt"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/idemkit/idem/sqlstore/sqlstoretest"
)

// newGaleraDatabase creates an empty database on the Galera cluster named
// by IDEM_TEST_GALERA_DSNS (created on the first node, replicated to the
// others). Every DSN asks for wsrep_sync_wait=1, as the sqlstore README
// recommends on Galera: a read waits until its node has applied what the
// other nodes committed before it, so a retry that lands on another node
// replays the first answer instead of racing it again.
func newGaleraDatabase(t testing.TB) *database {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	name := "idem_e2e_" + randomHex(6)
	d := &database{kind: "mysql"}
	var admin *mysql.Config
	for i, dsn := range sqlstoretest.DSNs(t, sqlstoretest.EnvGalera, 3) {
		cfg, err := mysql.ParseDSN(dsn)
		if err != nil {
			t.Fatalf("%s: %v", sqlstoretest.EnvGalera, err)
		}
		cfg.ParseTime = true
		if cfg.Params == nil {
			cfg.Params = map[string]string{}
		}
		cfg.Params["wsrep_sync_wait"] = "1"
		if i == 0 {
			admin = cfg.Clone()
		}
		cfg.DBName = name
		d.nodeDSNs = append(d.nodeDSNs, cfg.FormatDSN())
	}
	adb := openDB(t, "mysql", admin.FormatDSN())
	if _, err := adb.ExecContext(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatalf("galera: CREATE DATABASE %s: %v", name, err)
	}
	d.serviceDSN = d.nodeDSNs[0]
	d.db = openDB(t, "mysql", d.serviceDSN)
	// The other nodes apply the CREATE DATABASE a moment later (and a
	// connection names its database before wsrep_sync_wait applies).
	for _, dsn := range d.nodeDSNs[1:] {
		waitFor(t, "the database on every node", 10*time.Second, func() bool {
			db, err := sql.Open("mysql", dsn)
			if err == nil {
				err = db.PingContext(ctx)
				db.Close()
			}
			return err == nil
		})
		d.nodeDBs = append(d.nodeDBs, openDB(t, "mysql", dsn))
	}
	t.Cleanup(func() {
		for _, db := range d.nodeDBs {
			db.Close()
		}
		d.db.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := adb.ExecContext(ctx, "DROP DATABASE IF EXISTS "+name); err != nil {
			t.Errorf("galera: DROP DATABASE %s: %v", name, err)
		}
		adb.Close()
	})
	return d
}

// startReplicasOnNodes starts one process per Galera node (replica i on
// node i) behind a round-robin balancer.
func startReplicasOnNodes(t *testing.T, c config) ([]*server, *balancer) {
	t.Helper()
	first := c
	first.dsn = c.db.nodeDSNs[0]
	procs := []*server{startServer(t, "replica-0", first)}
	for i := 1; i < len(c.db.nodeDSNs); i++ {
		ci := c
		ci.dsn = c.db.nodeDSNs[i]
		procs = append(procs, launch(t, t, fmt.Sprintf("replica-%d", i), ci))
	}
	addrs := []string{procs[0].addr}
	for _, p := range procs[1:] {
		p.waitReady(t)
		addrs = append(addrs, p.addr)
	}
	return procs, newBalancer(t, addrs...)
}

// TestGaleraReplicas is issue 14: three processes, each on its own node of
// a MariaDB Galera cluster, behind a round-robin balancer. A node's claim
// cannot see another node's uncommitted claim; the cluster certifies one
// and rolls the others back, which the processes must answer as lost
// races (201 replay or 409), never 503, never a second effect.
func TestGaleraReplicas(t *testing.T) {
	for _, rs := range replicaSetups {
		if rs.db != "mysql" {
			continue
		}
		for _, fw := range []struct{ framework, store string }{{rs.framework, rs.store}, {"chi", "sql"}} {
			t.Run(fw.framework+"/"+fw.store, func(t *testing.T) {
				t.Parallel()
				base := config{framework: fw.framework, store: fw.store}
				t.Run("storms", func(t *testing.T) {
					c := base
					c.db = newGaleraDatabase(t)
					testGaleraStorm(t, c)
				})
				// The replica tests of one database server, with replica
				// i on node i.
				t.Run("storm-and-replay", func(t *testing.T) {
					c := base
					c.db = newGaleraDatabase(t)
					testReplicaStorm(t, c)
				})
				t.Run("sigkill-atomic", func(t *testing.T) {
					c := base
					c.db = newGaleraDatabase(t)
					c.extra = []string{"-work-delay", workDelay.String()}
					testReplicaKillAtomic(t, c)
				})
				t.Run("sigkill-leased", func(t *testing.T) {
					c := base
					c.db = newGaleraDatabase(t)
					c.extra = []string{"-work-delay", workDelay.String(), "-lease", lease.String()}
					testReplicaKillLeased(t, c)
				})
				t.Run("sweepers", func(t *testing.T) {
					c := base
					c.db = newGaleraDatabase(t)
					c.extra = []string{"-retention", sweepRetention.String(), "-sweep-every", "200ms"}
					testReplicaSweepers(t, c)
				})
				t.Run("payment-storm", func(t *testing.T) {
					c := base
					c.db = newGaleraDatabase(t)
					testGaleraPaymentStorm(t, c)
				})
			})
		}
	}
}

// testGaleraStorm: rounds of the 30-way order storm spread over the three
// nodes; one order per round, no 503; then a retry on each other node
// replays.
func testGaleraStorm(t *testing.T, c config) {
	procs, b := startReplicasOnNodes(t, c)
	const rounds = 3
	for round := range rounds {
		testStorm(t, freshClient, "http://"+b.addr(), fmt.Sprintf("gstorm%d", round), 30, false)
	}
	lost := 0
	for _, p := range procs {
		lost += len(p.logs.grep(regexp.MustCompile(`lost a race`)))
	}
	t.Logf("%d rounds of 30 over 3 nodes: %d answers were first executions that lost certification", rounds, lost)
	key, body, account := "gcross-"+randomHex(8), orderBody("gcross-widget", 1), "gcrosser"
	first, origin, err := b.send(http.MethodPost, "/orders", account, key, body)
	if err != nil || first.status != http.StatusCreated || first.replayed() {
		t.Fatalf("first request: %v (backend %d, %v)", first, origin, err)
	}
	for range 2 * replicas {
		a, served, err := b.send(http.MethodPost, "/orders", account, key, body)
		if err != nil {
			t.Fatalf("retry: %v", err)
		}
		if a.status != http.StatusCreated || !a.replayed() || string(a.body) != string(first.body) {
			t.Errorf("retry on node %d (first on %d): %v, want the replay of %q", served, origin, a, first.body)
		}
	}
	if n := c.db.count(t, `SELECT COUNT(*) FROM orders WHERE account = ?`, account); n != 1 {
		t.Errorf("orders of %s: %d, want 1", account, n)
	}
}

// testGaleraPaymentStorm: 24 concurrent payments with one key spread over
// the three nodes (leased mode: the claim commits before the provider is
// called). Exactly one provider charge and one recorded charge; every
// answer is the one 201, its replay, or 409 with Retry-After; never 503,
// never driver text.
func testGaleraPaymentStorm(t *testing.T, c config) {
	_, b := startReplicasOnNodes(t, c)
	testGaleraPaymentStormOn(t, c, b)
}

// testGaleraPaymentStormOn is testGaleraPaymentStorm through b.
func testGaleraPaymentStormOn(t *testing.T, c config, b *balancer) {
	account := "gpayer"
	oa, _, err := b.send(http.MethodPost, "/orders", account, "gpay-order", orderBody("yacht", 1))
	if err != nil || oa.status != http.StatusCreated {
		t.Fatalf("order: %v %v", oa, err)
	}
	o := decodeOrder(t, oa.body)
	path := fmt.Sprintf("/orders/%d/payments", o.ID)
	for round := range 3 {
		key, body := fmt.Sprintf("gpay-%d-%s", round, randomHex(8)), `{"amount_cents":4200}`
		const n = 24
		answers := make([]answer, n)
		errs := make([]error, n)
		var wg sync.WaitGroup
		gate := make(chan struct{})
		for i := range n {
			wg.Go(func() {
				<-gate
				answers[i], _, errs[i] = b.send(http.MethodPost, path, account, key, body)
			})
		}
		close(gate)
		wg.Wait()
		var first []byte
		executed, replayed, busy := 0, 0, 0
		for i, a := range answers {
			switch {
			case errs[i] != nil:
				t.Errorf("round %d, payment %d: %v", round, i, errs[i])
			case a.status == http.StatusCreated:
				if first == nil {
					first = a.body
				} else if string(a.body) != string(first) {
					t.Errorf("round %d, payment %d: 201 %s, but another 201 was %s: two charges", round, i, a.body, first)
				}
				if a.replayed() {
					replayed++
				} else {
					executed++
				}
			case a.status == http.StatusConflict && a.header.Get("Retry-After") != "" &&
				strings.HasPrefix(a.header.Get("Content-Type"), "application/problem+json"):
				busy++
			default:
				t.Errorf("round %d, payment %d: %v, want 201 or 409 with Retry-After", round, i, a)
			}
			if strings.Contains(string(a.body), "Error 1") || strings.Contains(string(a.body), "sqlstore") {
				t.Errorf("round %d, payment %d: driver text in the answer: %s", round, i, a.body)
			}
		}
		if executed != 1 {
			t.Errorf("round %d: %d payments executed, want 1", round, executed)
		}
		t.Logf("round %d: %d payments over 3 nodes: %d executed, %d replayed, %d in progress", round, n, executed, replayed, busy)
	}
	if got := c.db.count(t, `SELECT COUNT(*) FROM provider_charges WHERE account = ?`, account); got != 3 {
		t.Errorf("provider charges: %d, want 3 (one per round's key)", got)
	}
	if got := c.db.count(t, `SELECT COUNT(*) FROM charges WHERE account = ?`, account); got != 3 {
		t.Errorf("recorded charges: %d, want 3 (one per round's key)", got)
	}
}
