// Package sqlstoretest holds what the tests of idem's SQL stores share: the
// test databases from the environment, a statement-counting driver wrapper,
// and RunAtomic, the atomic-mode scenarios that sqlstore and gormstore both
// run against Postgres, MySQL/MariaDB and SQLite, and RunExactlyOnceAcross,
// one key's storm spread over the nodes of a multi-primary cluster (MariaDB
// Galera, EnvGalera). It imports no database driver: the tests bring their
// own.
package sqlstoretest

import (
	"crypto/rand"
	"encoding/hex"
	"os"
	"strings"
	"testing"
)

// Environment variables that name the test databases.
const (
	EnvPostgres = "IDEM_TEST_POSTGRES_DSN" // postgres://user:pass@127.0.0.1:5432/db?sslmode=disable
	EnvMySQL    = "IDEM_TEST_MYSQL_DSN"    // go-sql-driver DSN: user:pass@tcp(127.0.0.1:3306)/db?parseTime=true&loc=UTC
	EnvRequire  = "IDEM_REQUIRE_DB"        // non-empty: a missing database fails the test
)

// Required reports whether a missing database must fail a test instead of
// skipping it: when CI or IDEM_REQUIRE_DB is set (to anything).
func Required() bool {
	return os.Getenv("CI") != "" || os.Getenv(EnvRequire) != ""
}

// DSN returns the value of the environment variable env. When it is empty
// the test is skipped only if neither CI nor IDEM_REQUIRE_DB is set;
// otherwise it fails ("under CI a missing database is a failure").
func DSN(t testing.TB, env string) string {
	t.Helper()
	dsn := os.Getenv(env)
	if dsn == "" {
		if Required() {
			t.Fatalf("%s is not set and a database is required (CI or %s is set)", env, EnvRequire)
		}
		t.Skipf("%s is not set; skipping (set it, or run scripts/test.sh)", env)
	}
	return dsn
}

// Table returns a fresh table name, "idem_t_" and 16 random hex digits, so
// tests running in parallel against one database never share a table.
func Table() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return "idem_t_" + hex.EncodeToString(b[:])
}

// EnvGalera names a multi-primary cluster (MariaDB Galera): the DSNs of its
// nodes, comma separated (scripts/dbs.sh starts three on loopback).
const EnvGalera = "IDEM_TEST_GALERA_DSNS"

// DSNs returns the comma-separated DSNs of env (at least min of them),
// skipping or failing as DSN does when env is empty.
func DSNs(t testing.TB, env string, min int) []string {
	t.Helper()
	var out []string
	for _, d := range strings.Split(DSN(t, env), ",") {
		if d = strings.TrimSpace(d); d != "" {
			out = append(out, d)
		}
	}
	if len(out) < min {
		t.Fatalf("%s names %d DSNs, want at least %d", env, len(out), min)
	}
	return out
}
