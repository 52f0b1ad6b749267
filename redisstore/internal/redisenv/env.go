// Package redisenv gives the tests of redisstore the Redis servers that
// scripts/dbs.sh starts (start-redis), named by the environment: a missing
// one skips a test, or fails it when CI or IDEM_REQUIRE_DB is set.
package redisenv

import (
	"crypto/rand"
	"encoding/hex"
	"os"
	"strings"
	"testing"
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
