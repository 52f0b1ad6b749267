// Package redistest runs idem on real Redis servers through redisstore:
// the scenario suite (core/scenario) through every adapter (Gin, Echo v4,
// Echo v5, chi) in leased mode, gRPC (grpcidem) and consumers
// (core.Engine.Once), the store conformance suite on a 3-primary Redis
// Cluster, and a payment storm through a Sentinel failover. It is a
// module of its own so that redisstore's users do not inherit the
// adapters and frameworks its tests need.
//
// The servers come from the environment (scripts/dbs.sh start-redis
// writes it): IDEM_TEST_REDIS_ADDR, IDEM_TEST_REDIS_CLUSTER_ADDRS,
// IDEM_TEST_REDIS_SENTINEL_ADDRS, IDEM_TEST_REDIS_SENTINEL_MASTER and
// IDEM_TEST_REDIS_SENTINEL_PIDS. A missing one skips its tests, or fails
// them when CI or IDEM_REQUIRE_DB is set.
package redistest
