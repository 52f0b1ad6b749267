package storeutil

import (
	"strconv"
	"strings"
	"time"

	"github.com/idemkit/idem/core/store"
)

// Flavor is the SQL dialect of a marks statement.
type Flavor uint8

// The flavors of the SQL stores.
const (
	Postgres Flavor = iota + 1
	MySQL
	SQLite
)

// MarksTable is the name of the marks table (store.Settler) of records
// table t: "<t>_marks", its index "<t>_marks_due_idx" (62 bytes at most
// with a table of MaxTableLen).
func MarksTable(t string) string { return t + "_marks" }

// MarksSchema returns the statements that create the marks table of
// records table t and its index on due_at. The table is separate from the
// records table so that no statement of the request path changes, and
// routes that do not opt in (core.Name) write nothing to it; see
// docs/decisions.md ("A completer").
func MarksSchema(t string, f Flavor) []string {
	m := MarksTable(t)
	switch f {
	case Postgres:
		return []string{`CREATE TABLE IF NOT EXISTS ` + m + ` (
    id      BYTEA        NOT NULL PRIMARY KEY,
    token   BIGINT       NOT NULL,
    route   VARCHAR(100) NOT NULL,
    request BYTEA,
    due_at  TIMESTAMPTZ  NOT NULL,
    tries   INTEGER      NOT NULL DEFAULT 0
)`, `CREATE INDEX IF NOT EXISTS ` + m + `_due_idx ON ` + m + ` (due_at)`}
	case MySQL:
		return []string{`CREATE TABLE IF NOT EXISTS ` + m + ` (
    id      BINARY(32)   NOT NULL PRIMARY KEY,
    token   BIGINT       NOT NULL,
    route   VARCHAR(100) NOT NULL,
    request LONGBLOB,
    due_at  DATETIME(6)  NOT NULL,
    tries   INT          NOT NULL DEFAULT 0,
    INDEX ` + m + `_due_idx (due_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin`}
	}
	// Times are INTEGER microseconds since the Unix epoch, UTC.
	return []string{`CREATE TABLE IF NOT EXISTS ` + m + ` (
    id      BLOB    NOT NULL PRIMARY KEY,
    token   INTEGER NOT NULL,
    route   TEXT    NOT NULL,
    request BLOB,
    due_at  INTEGER NOT NULL,
    tries   INTEGER NOT NULL DEFAULT 0
)`, `CREATE INDEX IF NOT EXISTS ` + m + `_due_idx ON ` + m + ` (due_at)`}
}

// MarkStatements are the statements of store.Settler on one table.
// Their parameters:
//
//	Mark: id, token, route, request, due_at, tries.
//	Due: now, limit; it returns the mark's id, token, route, request,
//	  due_at and tries, then the record's columns as ListCols (all NULL
//	  when the record is gone), in due_at order.
//	Visit: next, tries, id, token, seen.
type MarkStatements struct {
	Mark, Due, Visit string
	f                Flavor
	m                string
}

// MarkSQL returns the marks statements of records table t in flavor f.
func MarkSQL(t string, f Flavor) MarkStatements {
	m := MarksTable(t)
	ph := placeholders(f)
	s := MarkStatements{f: f, m: m}
	ins := `INSERT INTO ` + m + ` (id, token, route, request, due_at, tries) VALUES (` +
		ph(1) + `, ` + ph(2) + `, ` + ph(3) + `, ` + ph(4) + `, ` + ph(5) + `, ` + ph(6) + `)`
	if f == MySQL {
		s.Mark = ins + ` ON DUPLICATE KEY UPDATE token = VALUES(token), route = VALUES(route), request = VALUES(request), due_at = VALUES(due_at), tries = VALUES(tries)`
	} else {
		s.Mark = ins + ` ON CONFLICT (id) DO UPDATE SET token = excluded.token, route = excluded.route, request = excluded.request, due_at = excluded.due_at, tries = excluded.tries`
	}
	rcols := `r.` + strings.ReplaceAll(strings.TrimSuffix(ListCols, `, NULL`), `, `, `, r.`) + `, NULL`
	s.Due = `SELECT m.id, m.token, m.route, m.request, m.due_at, m.tries, ` + rcols + ` FROM ` + m + ` m LEFT JOIN ` + t + ` r ON r.id = m.id
WHERE m.due_at <= ` + ph(1) + ` ORDER BY m.due_at, m.id LIMIT ` + ph(2)
	s.Visit = `UPDATE ` + m + ` SET due_at = ` + ph(1) + `, tries = ` + ph(2) + ` WHERE id = ` + ph(3) + ` AND token = ` + ph(4) + ` AND due_at = ` + ph(5)
	return s
}

// Stale returns the statement that reads, for deletion, n stale marks
// each given as (id, token, due_at), skipping marks another transaction
// has locked (Postgres, MySQL: FOR UPDATE SKIP LOCKED; its transaction
// then deletes them with Delete); on SQLite, which has no row locks, it
// deletes them itself.
func (s MarkStatements) Stale(n int) string {
	ph := placeholders(s.f)
	var b strings.Builder
	if s.f == SQLite {
		b.WriteString(`DELETE FROM ` + s.m + ` WHERE `)
	} else {
		b.WriteString(`SELECT id FROM ` + s.m + ` WHERE `)
	}
	for i := range n {
		if i > 0 {
			b.WriteString(` OR `)
		}
		b.WriteString(`(id = ` + ph(3*i+1) + ` AND token = ` + ph(3*i+2) + ` AND due_at = ` + ph(3*i+3) + `)`)
	}
	if s.f != SQLite {
		b.WriteString(` FOR UPDATE SKIP LOCKED`)
	}
	return b.String()
}

// Delete returns the statement that deletes n marks by id (the ones Stale
// locked).
func (s MarkStatements) Delete(n int) string {
	ph := placeholders(s.f)
	var b strings.Builder
	b.WriteString(`DELETE FROM ` + s.m + ` WHERE id IN (`)
	for i := range n {
		if i > 0 {
			b.WriteString(`, `)
		}
		b.WriteString(ph(i + 1))
	}
	b.WriteString(`)`)
	return b.String()
}

// StaleMark reports whether a mark that Due read with token is stale:
// its record (found, rec) is gone, carries another token, has expired at
// now, or is neither in progress nor indeterminate. Due deletes such marks
// (DeleteStale) instead of returning them.
func StaleMark(found bool, rec store.Record, token int64, now time.Time) bool {
	return !found || rec.Token != token || !rec.ExpiresAt.After(now) ||
		(rec.State != store.StateInProgress && rec.State != store.StateIndeterminate)
}

// DeleteStale deletes the stale marks that Due met, given as the
// arguments of Stale (each mark's id, token and due_at, as Due read
// them), each only if it is still as Due read it: on SQLite with Stale's
// DELETE; elsewhere Stale locks them, skipping marks another transaction
// holds, and Delete deletes the ones it locked. query runs a statement
// and returns the ids it selects (IDs), exec runs one; both in one
// transaction, except on SQLite, which needs none.
func (s MarkStatements) DeleteStale(args []any, query func(q string, args []any) ([]any, error), exec func(q string, args []any) error) error {
	n := len(args) / 3
	if s.f == SQLite {
		return exec(s.Stale(n), args)
	}
	ids, err := query(s.Stale(n), args)
	if err != nil || len(ids) == 0 {
		return err
	}
	return exec(s.Delete(len(ids)), ids)
}

// Rows is what the stores' row sets (*sql.Rows, pgx.Rows) have in common.
type Rows interface {
	Next() bool
	Scan(dest ...any) error
	Err() error
}

// IDs reads rows of one id column, as the arguments of Delete.
func IDs(rows Rows) ([]any, error) {
	var ids []any
	for rows.Next() {
		var id []byte
		if err := rows.Scan(&id); err != nil {
			return nil, err
		}
		ids = append(ids, id)
	}
	return ids, rows.Err()
}

// placeholders returns flavor f's n-th statement parameter (1-based).
func placeholders(f Flavor) func(n int) string {
	return func(n int) string {
		switch f {
		case Postgres:
			return "$" + strconv.Itoa(n)
		case MySQL:
			return "?"
		}
		return "?" + strconv.Itoa(n)
	}
}
