// Package gormstore is an idempotency store on GORM that joins the
// application's transaction (atomic mode) on Postgres, MySQL/MariaDB and SQLite.
package gormstore
