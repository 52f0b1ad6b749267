package e2e

import (
	"fmt"
	"net/http"
	"testing"
)

// TestReplicasMixedRouters is issue 22's cross-router case: three replicas
// of the service on one database, one on Gin, one on Echo, one on chi (what
// a rolling migration from one router to another looks like), behind a
// round-robin balancer. Gin spells the payment route /orders/:id/payments,
// chi /orders/{id}/payments: the identity of a request is (caller, scope,
// key), never the router's spelling of the route, so a payment key charges
// once whichever replica each attempt reaches, and a key reused for
// another request is a 422 on every replica.
func TestReplicasMixedRouters(t *testing.T) {
	for _, db := range []string{"postgres", "mysql"} {
		t.Run(db, func(t *testing.T) {
			t.Parallel()
			c := config{store: "sql", db: newDatabase(t, db)}
			b := startMixedReplicas(t, c)

			account := "mixed"
			oa, _, err := b.send(http.MethodPost, "/orders", account, "mixed-order-"+randomHex(4), orderBody("sail", 1))
			if err != nil || oa.status != http.StatusCreated {
				t.Fatalf("order: %v %v", oa, err)
			}
			path := fmt.Sprintf("/orders/%d/payments", decodeOrder(t, oa.body).ID)
			key, body := "mixed-pay-"+randomHex(8), `{"amount_cents":3100}`
			first, origin, err := b.send(http.MethodPost, path, account, key, body)
			if err != nil || first.status != http.StatusCreated || first.replayed() {
				t.Fatalf("first payment: %v (backend %d, %v)", first, origin, err)
			}
			for range 2 * replicas { // every replica, twice
				a, served, err := b.send(http.MethodPost, path, account, key, body)
				if err != nil || a.status != http.StatusCreated || !a.replayed() || string(a.body) != string(first.body) {
					t.Errorf("retry on %s (first on %s): %v %v, want the replay of %q", mixedFrameworks[served], mixedFrameworks[origin], a, err, first.body)
				}
			}
			wantOneCharge(t, c.db, decodeCharge(t, first.body), 3100)
			// The payment's key sent to create an order: another request.
			for range replicas {
				a, served, err := b.send(http.MethodPost, "/orders", account, key, orderBody("sail", 1))
				if err != nil || a.status != http.StatusUnprocessableEntity {
					t.Errorf("the payment's key on POST /orders through %s: %v %v, want 422", mixedFrameworks[served], a, err)
				}
			}
			if n := c.db.count(t, `SELECT COUNT(*) FROM orders WHERE account = ?`, account); n != 1 {
				t.Errorf("orders of %s: %d, want 1", account, n)
			}
			// Concurrent payments with one key spread over the three routers.
			testGaleraPaymentStormOn(t, c, b)
		})
	}
}

// mixedFrameworks is the framework of each replica startMixedReplicas
// starts, by backend index (-1: none).
var mixedFrameworks = map[int]string{-1: "no backend", 0: "gin", 1: "echo", 2: "chi"}

// startMixedReplicas starts one replica of c per framework on c's database
// (the first alone: it creates the schema) behind a round-robin balancer.
func startMixedReplicas(t *testing.T, c config) *balancer {
	t.Helper()
	first := c
	first.framework = mixedFrameworks[0]
	addrs := []string{startServer(t, "replica-gin", first).addr}
	var rest []*server
	for i := 1; i < replicas; i++ {
		ci := c
		ci.framework = mixedFrameworks[i]
		rest = append(rest, launch(t, t, "replica-"+ci.framework, ci))
	}
	for _, p := range rest {
		p.waitReady(t)
		addrs = append(addrs, p.addr)
	}
	return newBalancer(t, addrs...)
}
