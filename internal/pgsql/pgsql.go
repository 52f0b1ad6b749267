// Package pgsql holds the SQL of idem's Postgres stores: the table, its
// index and the statements that sqlstore (Postgres dialect, through
// database/sql) and pgxstore (native pgx) both run, so the two stores share
// one table and one SQL family. It is internal to idem: the stores export
// what applications need (sqlstore.Schema, the migrations/ files).
package pgsql

import (
	"strconv"
	"strings"

	"github.com/idemkit/idem/internal/storeutil"
)

// Cols is the column list every statement returns, in the stores' scan
// order.
const Cols = `id, caller, scope, idem_key, fingerprint, state, token, attempt, lease_until, expires_at, created_at, status, response`

// Schema returns the statements that create table t and its expiry index.
func Schema(t string) []string {
	return []string{`CREATE TABLE IF NOT EXISTS ` + t + ` (
    id          BYTEA        NOT NULL PRIMARY KEY,
    caller      VARCHAR(255) NOT NULL,
    scope       VARCHAR(255) NOT NULL,
    idem_key    VARCHAR(255) NOT NULL,
    fingerprint BYTEA,
    state       SMALLINT     NOT NULL,
    token       BIGINT       NOT NULL,
    attempt     INTEGER      NOT NULL,
    lease_until TIMESTAMPTZ,
    expires_at  TIMESTAMPTZ  NOT NULL,
    created_at  TIMESTAMPTZ  NOT NULL,
    status      INTEGER      NOT NULL DEFAULT 0,
    response    BYTEA
)`, `CREATE INDEX IF NOT EXISTS ` + t + `_expires_at_idx ON ` + t + ` (expires_at)`}
}

// Statements are the Postgres statements of one table. Their parameters:
//
//	Insert, InsertLeased: $1 lock key, $2 id, $3 caller, $4 scope, $5 key,
//	  $6 fingerprint, $7 token, $8 lease_until, $9 expires_at, $10 now;
//	  they return nothing (one row affected: claimed).
//	Claim, ClaimLeased: $1 lock key, $2 id, $3 caller, $4 scope, $5 key,
//	  $6 fingerprint, $7 token, $8 lease_until, $9 expires_at, $10 now,
//	  $11 takeover; they return ok (the advisory lock was taken), inserted,
//	  then Cols (all NULL when no row exists).
//	InsertMarked, InsertLeasedMarked: Insert's parameters, then the
//	  mark's (store.ClaimRequest.Mark): $11 route, $12 request, $13 due_at,
//	  $14 tries; one row affected: claimed, and marked.
//	ClaimMarked, ClaimLeasedMarked: Claim's parameters, then the mark's:
//	  $12 route, $13 request, $14 due_at, $15 tries; they return what
//	  Claim returns.
//	Read: $1 id.  Get: $1 id, $2 now.  Exists: $1 id.
//	Complete: $1 state, $2 status, $3 response, $4 expires_at, $5 id, $6 token.
//	Extend: $1 lease_until, $2 lease_until, $3 id, $4 token.
//	Release: $1 id, $2 token.
//	DeleteExpired: $1 now, $2 limit.
type Statements struct {
	Insert, InsertLeased               string
	Claim, ClaimLeased                 string
	InsertMarked, InsertLeasedMarked   string
	ClaimMarked, ClaimLeasedMarked     string
	Read, Get, Exists                  string
	Complete, Extend, Release          string
	DeleteExpired                      string
	Now, MigrateLock, PrimaryKey, Cols string
}

// A claim is first Insert: the row of an id never seen, one plain INSERT
// whose lock probe rides in its WHERE, returning nothing (the store
// builds the record from the request). The probe comes after a look at
// the row (CASE fixes the order): an id that has a row, committed as the
// statement's snapshot sees it, takes no lock and inserts nothing, so a
// replay holds no lock either. An id without one is inserted only by the
// transaction that gets pg_try_advisory_xact_lock; one that does not get
// it inserts nothing, so the INSERT never meets another claimer's
// uncommitted row (every writer of a new row holds the lock), and
// ON CONFLICT DO NOTHING is only for a row committed between the
// statement's snapshot and the lock. When Insert inserts nothing, the
// store reads the row (Read) and, unless it answers the claim (a live
// record that cannot be claimed), runs Claim, which also covers expired
// rows, lapsed leases and the races: no row at all (another transaction
// holds the id's lock, or a sweep or a release deleted the row after
// Insert saw it) is Claim's too, never an answer of its own.
//
// Outside a transaction (leased mode) Insert takes the lock in shared
// mode, as ClaimLeased does.
const insert = `INSERT INTO %t (` + insertCols + `)
SELECT $2::bytea, $3::varchar, $4::varchar, $5::varchar, $6::bytea, 1::smallint, $7::bigint, 1,
       $8::timestamptz, $9::timestamptz, $10::timestamptz, 0
 WHERE CASE WHEN EXISTS (SELECT FROM %t v WHERE v.id = $2) THEN FALSE ELSE %s END
ON CONFLICT (id) DO NOTHING`

// insertCols are the columns Insert writes (response stays NULL).
const insertCols = `id, caller, scope, idem_key, fingerprint, state, token, attempt, lease_until, expires_at, created_at, status`

// The claim is one statement. pg_try_advisory_xact_lock on a 64-bit key
// derived from the id (and the table name, LockKey) is the non-blocking
// probe: only the transaction that holds the lock goes on to
// INSERT ... ON CONFLICT, so ON CONFLICT never waits for another claimer's
// uncommitted row. The lock is transaction-scoped: in atomic mode it is held
// until the business transaction ends; in leased mode (autocommit) until the
// statement's implicit transaction commits. The last SELECT returns the
// inserted or taken-over row, or else the existing row as the statement's
// snapshot sees it (a data-modifying CTE's output is visible, its effects
// are not).
//
// A claim that sees a live row it may not take (completed, indeterminate,
// or in progress under a live lease) takes no lock: it answers from the
// row. So a transaction whose claim did not claim holds no lock (except
// when it retried a race, below), and a duplicate never waits on it: a
// pipelining store can end such a transaction after the answer.
//
// Outside a transaction (leased mode) the claim takes the lock in shared
// mode (pg_try_advisory_xact_lock_shared): leased claims of one id do not
// exclude each other (ON CONFLICT settles their race, each waiting at most
// for another leased claim's one-statement transaction), but they fail at
// once while a transaction in atomic mode holds the exclusive lock, and an
// atomic claim fails at once while a leased claim is running.
const claim = `WITH lk AS MATERIALIZED (
    SELECT CASE WHEN EXISTS (
        SELECT FROM %t v WHERE v.id = $2 AND v.expires_at > $10
           AND NOT ($11::boolean AND v.state = 1 AND COALESCE(v.lease_until <= $10, FALSE))
    ) THEN FALSE ELSE %s END AS ok
), ins AS (
    INSERT INTO %t AS r (` + Cols + `)
    SELECT $2::bytea, $3::varchar, $4::varchar, $5::varchar, $6::bytea, 1::smallint, $7::bigint, 1,
           $8::timestamptz, $9::timestamptz, $10::timestamptz, 0, NULL::bytea
      FROM lk WHERE lk.ok
    ON CONFLICT (id) DO UPDATE SET
        caller = EXCLUDED.caller, scope = EXCLUDED.scope, idem_key = EXCLUDED.idem_key,
        fingerprint = EXCLUDED.fingerprint, state = 1, token = EXCLUDED.token,
        attempt = CASE WHEN r.expires_at <= $10 THEN 1 ELSE r.attempt + 1 END,
        lease_until = EXCLUDED.lease_until, expires_at = EXCLUDED.expires_at,
        created_at = CASE WHEN r.expires_at <= $10 THEN EXCLUDED.created_at ELSE r.created_at END,
        status = 0, response = NULL
    WHERE r.expires_at <= $10
       OR ($11::boolean AND r.state = 1 AND r.lease_until <= $10)
    RETURNING r.id, r.caller, r.scope, r.idem_key, r.fingerprint, r.state, r.token, r.attempt,
              r.lease_until, r.expires_at, r.created_at, r.status, r.response
)
SELECT lk.ok, TRUE, ins.* FROM lk CROSS JOIN ins
UNION ALL
SELECT lk.ok, FALSE, r.id, r.caller, r.scope, r.idem_key, r.fingerprint, r.state, r.token, r.attempt,
       r.lease_until, r.expires_at, r.created_at, r.status, r.response
  FROM lk LEFT JOIN %t r ON r.id = $2
 WHERE NOT EXISTS (SELECT FROM ins)`

// A marked claim (a route named for the completer, store.ClaimRequest.Mark)
// writes the record's mark in the claim's own statement: a data-modifying
// CTE upserts the mark from the row the claim inserted or took over, so
// the mark exists exactly when the claim claimed, and commits with it
// (autocommit: one statement; atomic mode: the claim's transaction). A
// claim that claims nothing writes no mark: the holder's stays.
//
// Insert's marked form wraps it: the INSERT is the CTE, and the mark's
// INSERT its main statement, whose one affected row says claimed.
const insertMarked = `WITH c AS (
%s
RETURNING id, token
)
%u`

// markUpsert is the mark's upsert into the marks table %m, from the rows
// of %f (the claim's CTE), with the mark's parameters from $%n.
const markUpsert = `INSERT INTO %m (id, token, route, request, due_at, tries)
SELECT %f.id, %f.token, $%n0::varchar, $%n1::bytea, $%n2::timestamptz, $%n3::integer FROM %f
ON CONFLICT (id) DO UPDATE SET token = excluded.token, route = excluded.route, request = excluded.request,
    due_at = excluded.due_at, tries = excluded.tries`

// marked returns the upsert of the mark from the rows of from, whose
// parameters start at $first.
func marked(marks, from string, first int) string {
	r := strings.NewReplacer("%m", marks, "%f", from,
		"%n0", strconv.Itoa(first), "%n1", strconv.Itoa(first+1), "%n2", strconv.Itoa(first+2), "%n3", strconv.Itoa(first+3))
	return r.Replace(markUpsert)
}

// claimMarked is Claim with the mark's upsert as one more CTE (Postgres
// runs every data-modifying CTE to completion, read or not).
func claimMarked(claim, marks string) string {
	const main = "\nSELECT lk.ok, TRUE, ins.*"
	i := strings.Index(claim, main)
	return claim[:i] + ", mk AS (\n" + marked(marks, "ins", 12) + "\n)" + claim[i:]
}

// New returns the statements of table t.
func New(t string) Statements {
	c := strings.ReplaceAll(claim, "%t", t)
	ins := strings.ReplaceAll(insert, "%t", t)
	const lock, shared = `pg_try_advisory_xact_lock($1::bigint)`, `pg_try_advisory_xact_lock_shared($1::bigint)`
	m := storeutil.MarksTable(t)
	insMarked := func(ins string) string {
		return strings.NewReplacer("%s", ins, "%u", marked(m, "c", 11)).Replace(insertMarked)
	}
	return Statements{
		Insert:             strings.Replace(ins, "%s", lock, 1),
		InsertLeased:       strings.Replace(ins, "%s", shared, 1),
		Claim:              strings.Replace(c, "%s", lock, 1),
		ClaimLeased:        strings.Replace(c, "%s", shared, 1),
		InsertMarked:       insMarked(strings.Replace(ins, "%s", lock, 1)),
		InsertLeasedMarked: insMarked(strings.Replace(ins, "%s", shared, 1)),
		ClaimMarked:        claimMarked(strings.Replace(c, "%s", lock, 1), m),
		ClaimLeasedMarked:  claimMarked(strings.Replace(c, "%s", shared, 1), m),
		Read:               `SELECT ` + Cols + ` FROM ` + t + ` WHERE id = $1`,
		Get:                `SELECT ` + Cols + ` FROM ` + t + ` WHERE id = $1 AND expires_at > $2`,
		Exists:             `SELECT 1 FROM ` + t + ` WHERE id = $1`,
		Complete:           `UPDATE ` + t + ` SET state = $1, status = $2, response = $3, expires_at = $4, lease_until = NULL WHERE id = $5 AND token = $6 AND state IN (1, 3)`,
		Extend:             `UPDATE ` + t + ` SET lease_until = $1, expires_at = GREATEST(expires_at, $2) WHERE id = $3 AND token = $4 AND state = 1`,
		Release:            `DELETE FROM ` + t + ` WHERE id = $1 AND token = $2 AND state IN (1, 3)`,
		// The batch is locked through the expires_at index and deleted by
		// ctid (a TID scan of the locked rows). The earlier form,
		// "WHERE id IN (SELECT id ... FOR UPDATE SKIP LOCKED)", got a generic
		// plan after five executions of the cached statement (pgx caches
		// them), a hash semi-join that read every expired row for each
		// batch: 1,000 rows/s on a table of a million expired records.
		DeleteExpired: `DELETE FROM ` + t + ` WHERE ctid = ANY(ARRAY(
    SELECT ctid FROM ` + t + ` WHERE expires_at <= $1 ORDER BY expires_at LIMIT $2 FOR UPDATE SKIP LOCKED
)) AND expires_at <= $1`,
		Now:         `SELECT CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000000 AS BIGINT)`,
		MigrateLock: `SELECT pg_advisory_xact_lock($1)`,
		PrimaryKey: `SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)
WHERE i.indrelid = to_regclass($1) AND i.indisprimary`,
		Cols: Cols,
	}
}

// Fnv64 is FNV-1a over s: the per-table part of the advisory lock keys.
func Fnv64(s string) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= 1099511628211
	}
	return h
}

// LockKey is the advisory lock key of a record id in table t (tableHash is
// Fnv64(t)): both stores on one table take the same lock for one id.
func LockKey(id [32]byte, tableHash uint64) int64 {
	var v uint64
	for _, b := range id[:8] {
		v = v<<8 | uint64(b)
	}
	return int64(v ^ tableHash)
}

// MigrateLockKey is the advisory lock key Migrate holds on table t.
func MigrateLockKey(t string) int64 { return int64(Fnv64("idem/migrate/" + t)) }
