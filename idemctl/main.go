// Command idemctl lets an operator answer "which requests are stuck, and
// why?" and act on them, without SQL: it lists idem's records by state
// and age, shows one by its record_id (the id a client gets in every
// problem document, and the "id" of the engine's log lines), and resolves
// or releases the ones whose outcome is unknown, through the same fenced
// operations as the engine (core.Engine.ResolveRecord,
// core.Engine.ReleaseRecord).
//
//	idemctl list    [-state indeterminate|in_progress|completed] [-older 5m] [-limit 50] [-after NEXT]
//	idemctl show    RECORD_ID
//	idemctl resolve RECORD_ID -outcome applied -status 201 [-header 'Name: value']... [-body TEXT | -body-file FILE] -reason TEXT
//	idemctl resolve RECORD_ID -outcome not_applied -reason TEXT
//	idemctl release RECORD_ID -reason TEXT
//
// Every command takes the database as -dsn (or the IDEMCTL_DSN
// environment variable, which keeps a password out of the shell's
// history) and the table as -table (default idempotency_records). The
// database is told by the DSN: postgres:// or postgresql:// (PostgreSQL,
// through pgx), a go-sql-driver DSN such as user:pass@tcp(host:3306)/db or
// mysql://... (MySQL, MariaDB), file:..., sqlite://... or a path ending in
// .db, .sqlite or .sqlite3 (SQLite); -db postgres|mysql|sqlite says it
// when the DSN does not. The records are sqlstore's table, which gormstore
// and pgxstore share. -json prints JSON (the admin.Page and
// admin.Record of the admin handler) instead of text.
//
// Each resolve and release is logged on standard error, with the record
// id and the reason. Responses recorded with a seal.Sealer cannot be shown
// here (no key), and an answer recorded here is not sealed: where
// responses are sealed, use the application's core.Engine.AdminHandler.
//
// Exit status: 0 done, 1 refused or failed (the message says why), 2 a
// command line that is not understood.
package main

import (
	"context"
	"os"
	"os/signal"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr, os.Getenv)
	stop()
	os.Exit(code)
}
