package redistest

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/redisstore"
	"github.com/idemkit/idem/redisstore/internal/redisenv"
)

// client returns a client of the single test server, closed at cleanup.
func client(t testing.TB) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: redisenv.Get(t, redisenv.EnvAddr)})
	t.Cleanup(func() { c.Close() })
	if err := c.Ping(context.Background()).Err(); err != nil {
		t.Fatalf("redis at %s: %v", c.Options().Addr, err)
	}
	return c
}

// newStore returns a store on c with a prefix of its own, whose keys are
// deleted at cleanup.
func newStore(t testing.TB, c redis.UniversalClient, opts ...redisstore.Option) *redisstore.Store {
	t.Helper()
	prefix := redisenv.Prefix()
	s, err := redisstore.New(c, append([]redisstore.Option{redisstore.WithPrefix(prefix)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx := context.Background()
		del := func(ctx context.Context, c *redis.Client) error {
			iter := c.Scan(ctx, 0, prefix+"*", 1000).Iterator()
			for iter.Next(ctx) {
				c.Del(ctx, iter.Val())
			}
			return iter.Err()
		}
		switch c := c.(type) {
		case *redis.ClusterClient:
			_ = c.ForEachMaster(ctx, del)
		case *redis.Client:
			_ = del(ctx, c)
		}
	})
	return s
}

// onRedis is the scenario suite's option that runs it on the single
// test server, a fresh prefix per scenario.
func onRedis(t *testing.T) func(t *testing.T) core.Store {
	c := client(t)
	return func(t *testing.T) core.Store { return newStore(t, c) }
}

var epochNow = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)

const lease = 30 * time.Second
