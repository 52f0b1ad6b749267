// Package migrations holds tests only: the migration files that sqlstore
// ships (sqlstore/migrations) run unchanged with golang-migrate
// (migrations/<dialect>) and with goose (migrations/goose/<dialect>),
// through each tool's Go API, against PostgreSQL, MySQL/MariaDB and SQLite,
// and the stores' Check accepts the table they build.
//
// It is a module of its own so that neither tool (nor their drivers)
// becomes a requirement of sqlstore or any other library module. It is not
// released (scripts/modules.sh).
//
// Databases come from IDEM_TEST_POSTGRES_DSN and IDEM_TEST_MYSQL_DSN; a
// missing one skips its tests, or fails them when CI or IDEM_REQUIRE_DB is
// set. The files create the default table, idempotency_records, so every
// test works in a schema (Postgres) or database (MariaDB) of its own,
// created and dropped by the test: the DSN's user needs the right to
// create them.
package migrations
