package redistest

import (
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem/core/store"
	"github.com/idemkit/idem/redisstore"
	"github.com/idemkit/idem/redisstore/internal/redisenv"
)

func client(t testing.TB) *redis.Client { return redisenv.Client(t) }

func newStore(t testing.TB, c redis.UniversalClient, opts ...redisstore.Option) *redisstore.Store {
	return redisenv.NewStore(t, c, opts...)
}

// onRedis is the scenario suite's option that runs it on the single
// test server, a fresh prefix per scenario.
func onRedis(t *testing.T) func(t *testing.T) store.Store {
	c := client(t)
	return func(t *testing.T) store.Store { return newStore(t, c) }
}

var epochNow = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)

const lease = 30 * time.Second
