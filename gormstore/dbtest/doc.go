// Package dbtest holds gormstore's tests against real databases (Postgres,
// MySQL/MariaDB, SQLite through GORM) and its runnable examples. It is a
// module of its own so that the GORM drivers the tests use, above all the
// pure-Go SQLite one (github.com/glebarez/sqlite on modernc.org/sqlite,
// which needs a newer Go than gormstore), are requirements of this test
// module and never of gormstore, which a user imports. It is never
// published or imported; scripts/test.sh runs it with the other modules of
// go.work.
package dbtest
