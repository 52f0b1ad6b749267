// Package sqltest runs grpcidem in atomic mode against real Postgres,
// MySQL/MariaDB and SQLite through sqlstore. It is a module of its own so
// that grpcidem's users do not inherit the database drivers its tests need.
package sqltest
