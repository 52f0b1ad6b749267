package redisstore_test

import (
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem/core/store"
	"github.com/idemkit/idem/core/storetest"
	"github.com/idemkit/idem/redisstore"
	"github.com/idemkit/idem/redisstore/internal/redisenv"
)

func client(t testing.TB) *redis.Client { return redisenv.Client(t) }

func newStore(t testing.TB, c redis.UniversalClient, opts ...redisstore.Option) *redisstore.Store {
	return redisenv.NewStore(t, c, opts...)
}

func deleteKeys(t testing.TB, c redis.UniversalClient, prefix string) {
	redisenv.DeleteKeys(t, c, prefix)
}

func TestConformance(t *testing.T) {
	c := client(t)
	storetest.Run(t, func(t *testing.T) store.Store { return newStore(t, c) })
}
