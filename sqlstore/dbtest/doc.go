// Package dbtest holds sqlstore's tests against real databases (Postgres,
// MySQL/MariaDB, a MariaDB Galera cluster, SQLite) and its runnable
// examples. It is a module of its own so that the drivers the tests use,
// above all the pure-Go SQLite driver (modernc.org/sqlite, which needs a
// newer Go than sqlstore), are requirements of this test module and never
// of sqlstore, which a user imports. It is never published or imported;
// scripts/test.sh runs it with the other modules of go.work.
package dbtest
