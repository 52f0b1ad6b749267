// Package e2e holds the end-to-end tests of the example orders service
// (examples/orders). They build the service once (TestMain, with -race when
// the tests run with -race), start it as separate processes listening on
// loopback, and talk to them over TCP only, as a user would:
//
//   - e2e_test.go: every database (SQLite, Postgres, MariaDB) times every
//     framework (Gin, Echo, chi), alternating the store (GORM, database/sql)
//     so both stores run on every database: a 50-way storm on one key, a
//     response lost between server and client (a cutting TCP proxy), SIGKILL
//     inside the atomic transaction and inside a leased payment, two accounts
//     on one key, a changed body under a used key, graceful SIGTERM.
//   - replicas_test.go: three processes on one Postgres and on one MariaDB
//     database behind a round-robin TCP balancer: the storm spread over the
//     processes, a replay from another process, SIGKILL with the retry on a
//     survivor (atomic and leased), and three sweepers deleting expired rows
//     at once.
//   - client_test.go: idemclient (the client half) against the service:
//     answers dropped after the service committed, an attempt timeout
//     during a slow leased payment, and a default client through SIGKILL
//     inside a leased payment and a restart on the same address 5 s later
//     (the takeover's answer, one charge).
//   - otel_test.go: the OpenTelemetry example (examples/otel, built too):
//     otelidem's metrics and span events as JSON on standard output (-otel
//     stdout) and on GET /metrics (-otel prometheus), and neither without
//     the flag, nor from the orders service.
//
// Postgres and MariaDB come from IDEM_TEST_POSTGRES_DSN and
// IDEM_TEST_MYSQL_DSN (scripts/test.sh starts both); every test creates a
// database of its own (idem_e2e_<random>) and drops it afterwards. A missing
// DSN skips those tests, or fails them when CI or IDEM_REQUIRE_DB is set.
package e2e
