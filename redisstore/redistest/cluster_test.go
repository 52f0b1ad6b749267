package redistest

import (
	"context"
	"sync"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem/core/scenario"
	"github.com/idemkit/idem/core/store"
	"github.com/idemkit/idem/core/storetest"
	"github.com/idemkit/idem/redisstore/internal/redisenv"
)

// cluster returns a client of the 3-primary test cluster, closed at
// cleanup.
func cluster(t testing.TB) *redis.ClusterClient {
	t.Helper()
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: redisenv.List(t, redisenv.EnvCluster, 3)})
	t.Cleanup(func() { c.Close() })
	if err := c.Ping(context.Background()).Err(); err != nil {
		t.Fatalf("redis cluster: %v", err)
	}
	return c
}

// TestClusterConformance runs the store conformance suite on a Redis
// Cluster of three primaries: every record is one key (one hash slot),
// so the scripts run unchanged; List and DeleteExpired scan every
// primary.
func TestClusterConformance(t *testing.T) {
	c := cluster(t)
	storetest.Run(t, func(t *testing.T) store.Store { return newStore(t, c) })
}

// TestClusterScenarios runs the scenario suite on the cluster through
// one adapter (chi; the others differ only above the store).
func TestClusterScenarios(t *testing.T) {
	c := cluster(t)
	scenario.Run(t, adapters[3].route, scenario.OnStore(func(t *testing.T) store.Store { return newStore(t, c) }))
}

// TestClusterSpreads: the records of one store land on every primary
// (the hash tag is the record's ID, not the prefix).
func TestClusterSpreads(t *testing.T) {
	c := cluster(t)
	s := newStore(t, c)
	ctx := t.Context()
	for i := range 64 {
		req := store.ClaimRequest{ID: store.Identity{Key: string(rune('a' + i))}.ID(), Token: int64(i + 1), Now: epochNow, LeaseUntil: epochNow.Add(lease), ExpiresAt: epochNow.Add(lease)}
		if _, err := s.Claim(ctx, req); err != nil {
			t.Fatal(err)
		}
	}
	var (
		mu     sync.Mutex
		counts []int64
	)
	err := c.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error {
		size, err := n.DBSize(ctx).Result()
		mu.Lock()
		counts = append(counts, size)
		mu.Unlock()
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range counts {
		if n == 0 {
			t.Fatalf("keys per primary %v: a primary holds none of 64 records", counts)
		}
	}
}
