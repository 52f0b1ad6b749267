// Package sqlstore is an idempotency store on database/sql that joins the
// application's transaction (atomic mode) on Postgres, MySQL/MariaDB and SQLite.
package sqlstore
