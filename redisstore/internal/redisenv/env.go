// Package redisenv gives the tests of redisstore the Redis servers that
// scripts/dbs.sh starts (start-redis), named by the environment (a missing
// one skips a test, or fails it when CI or IDEM_REQUIRE_DB is set), and
// stores on them that clean up after themselves.
package redisenv

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem/redisstore"
)

// Environment variables that name the test servers.
const (
	// EnvAddr: one server, host:port.
	EnvAddr = "IDEM_TEST_REDIS_ADDR"
	// EnvCluster: the primaries of a Redis Cluster, comma separated.
	EnvCluster = "IDEM_TEST_REDIS_CLUSTER_ADDRS"
	// EnvSentinel: the sentinels that watch EnvSentinelMaster, comma
	// separated.
	EnvSentinel = "IDEM_TEST_REDIS_SENTINEL_ADDRS"
	// EnvSentinelMaster: the master name the sentinels watch.
	EnvSentinelMaster = "IDEM_TEST_REDIS_SENTINEL_MASTER"
	// EnvRequire: non-empty, a missing server fails the test.
	EnvRequire = "IDEM_REQUIRE_DB"
)

// Required reports whether a missing server must fail a test instead of
// skipping it: when CI or IDEM_REQUIRE_DB is set (to anything).
func Required() bool { return os.Getenv("CI") != "" || os.Getenv(EnvRequire) != "" }

// Get returns the value of env; when it is empty the test is skipped, or
// fails under Required.
func Get(t testing.TB, env string) string {
	t.Helper()
	v := os.Getenv(env)
	if v == "" {
		if Required() {
			t.Fatalf("%s is not set and a database is required (CI or %s is set): run scripts/dbs.sh start-redis DIR and source DIR/env", env, EnvRequire)
		}
		t.Skipf("%s is not set; skipping (set it, or run scripts/test.sh)", env)
	}
	return v
}

// List returns the comma-separated values of env, at least min of them.
func List(t testing.TB, env string, min int) []string {
	t.Helper()
	var out []string
	for v := range strings.SplitSeq(Get(t, env), ",") {
		if v = strings.TrimSpace(v); v != "" {
			out = append(out, v)
		}
	}
	if len(out) < min {
		t.Fatalf("%s names %d values, want at least %d", env, len(out), min)
	}
	return out
}

// Prefix returns a fresh key prefix, "idemtest:" and 16 random hex digits
// and a colon, so that tests sharing a server never share records.
func Prefix() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return "idemtest:" + hex.EncodeToString(b[:]) + ":"
}

// Client returns a client of the single test server (EnvAddr), closed at
// cleanup.
func Client(t testing.TB) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: Get(t, EnvAddr)})
	t.Cleanup(func() { c.Close() })
	if err := c.Ping(context.Background()).Err(); err != nil {
		t.Fatalf("redis at %s: %v", c.Options().Addr, err)
	}
	return c
}

// NewStore returns a store on c with a fresh Prefix and opts; its keys
// are deleted at cleanup.
func NewStore(t testing.TB, c redis.UniversalClient, opts ...redisstore.Option) *redisstore.Store {
	t.Helper()
	prefix := Prefix()
	s, err := redisstore.New(c, append([]redisstore.Option{redisstore.WithPrefix(prefix)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { DeleteKeys(t, c, prefix) })
	return s
}

// DeleteKeys deletes every key under prefix (on every primary of a
// cluster).
func DeleteKeys(t testing.TB, c redis.UniversalClient, prefix string) {
	ctx := context.Background()
	del := func(ctx context.Context, c *redis.Client) error {
		iter := c.Scan(ctx, 0, prefix+"*", 1000).Iterator()
		for iter.Next(ctx) {
			c.Del(ctx, iter.Val())
		}
		return iter.Err()
	}
	var err error
	switch c := c.(type) {
	case *redis.ClusterClient:
		err = c.ForEachMaster(ctx, del)
	case *redis.Client:
		err = del(ctx, c)
	}
	if err != nil {
		t.Logf("deleting the test's keys: %v", err)
	}
}
