// Package reliability holds idem's attempts to break itself: tests only,
// run with the rest of the suite (scripts/test.sh, -race) in a short form,
// and at length with -reliability.long.
//
//   - Linearizability (linearizability_test.go): concurrent Claim, Extend,
//     Complete, Release, Get, DeleteExpired and transactional claims, with
//     times that move past leases and expiries, are recorded against every
//     store (memstore and its atomic view; sqlstore and gormstore on
//     PostgreSQL, MySQL/MariaDB and SQLite) and checked with porcupine
//     against a sequential model of the contract in core/store.go.
//   - Database faults (faults_test.go): a TCP proxy between the store and
//     PostgreSQL or MariaDB adds latency and cuts connections mid-transaction
//     and mid-commit while the HTTP middleware (sqlstore in atomic and
//     leased mode, gormstore in atomic mode) is hammered; no key may run
//     twice, no client may see a success whose effect is missing, and no
//     record may stay in progress in atomic mode.
//   - Lease edge cases (lease_test.go): an attempt paused past its lease is
//     taken over; the takeover's answer wins, the stale completion is
//     refused and reported (every store, in leased mode).
//
// The fuzzing of the HTTP boundary and the tenant isolation property test
// need nothing but the standard library and live in package core
// (core/fuzz_http_test.go, core/isolation_test.go).
//
// Databases come from IDEM_TEST_POSTGRES_DSN and IDEM_TEST_MYSQL_DSN; a
// missing one skips its tests, or fails them when CI or IDEM_REQUIRE_DB is
// set. Every test works on tables of its own.
package reliability
