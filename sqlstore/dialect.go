package sqlstore

import (
	"database/sql"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/idemkit/idem/core/store"
	"github.com/idemkit/idem/internal/pgsql"
	"github.com/idemkit/idem/internal/storeutil"
)

// Dialect selects the SQL a Store writes.
type Dialect uint8

const (
	// Postgres: PostgreSQL 12 or later, through any database/sql driver
	// (github.com/jackc/pgx/v5/stdlib, github.com/lib/pq).
	Postgres Dialect = iota + 1
	// MySQL: MySQL 8.0.1 or later and MariaDB 10.6 or later, through
	// github.com/go-sql-driver/mysql (loc=UTC, the driver's default).
	MySQL
	// SQLite: SQLite 3.35 or later (RETURNING), for example the pure-Go
	// modernc.org/sqlite.
	SQLite
)

func (d Dialect) valid() bool { return d >= Postgres && d <= SQLite }

func (d Dialect) String() string {
	switch d {
	case Postgres:
		return "postgres"
	case MySQL:
		return "mysql"
	case SQLite:
		return "sqlite"
	}
	return fmt.Sprintf("Dialect(%d)", uint8(d))
}

// Schema returns the DDL that creates table and its expiry index in dialect
// d, as the files in migrations/<dialect>/0001_idempotency_records.up.sql
// hold it for the default table. Every dialect has the same columns, so a
// gormstore and a sqlstore can share one table.
func Schema(d Dialect, table string) string {
	return strings.Join(d.schema(table), ";\n\n") + ";\n"
}

// dropSchema is the down migration.
func dropSchema(d Dialect, table string) string {
	return "DROP TABLE IF EXISTS " + table + ";\n"
}

func (d Dialect) schema(t string) []string {
	switch d {
	case Postgres:
		return pgsql.Schema(t)
	case MySQL:
		// No CREATE INDEX IF NOT EXISTS on MySQL 8: the index is inline.
		return []string{`CREATE TABLE IF NOT EXISTS ` + t + ` (
    id          BINARY(32)   NOT NULL PRIMARY KEY,
    caller      VARCHAR(255) NOT NULL,
    scope       VARCHAR(255) NOT NULL,
    idem_key    VARCHAR(255) NOT NULL,
    fingerprint BLOB,
    state       SMALLINT     NOT NULL,
    token       BIGINT       NOT NULL,
    attempt     INT          NOT NULL,
    lease_until DATETIME(6),
    expires_at  DATETIME(6)  NOT NULL,
    created_at  DATETIME(6)  NOT NULL,
    status      INT          NOT NULL DEFAULT 0,
    response    LONGBLOB,
    INDEX ` + t + `_expires_at_idx (expires_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin`}
	default:
		// Times are INTEGER microseconds since the Unix epoch, UTC.
		return []string{`CREATE TABLE IF NOT EXISTS ` + t + ` (
    id          BLOB    NOT NULL PRIMARY KEY,
    caller      TEXT    NOT NULL,
    scope       TEXT    NOT NULL,
    idem_key    TEXT    NOT NULL,
    fingerprint BLOB,
    state       INTEGER NOT NULL,
    token       INTEGER NOT NULL,
    attempt     INTEGER NOT NULL,
    lease_until INTEGER,
    expires_at  INTEGER NOT NULL,
    created_at  INTEGER NOT NULL,
    status      INTEGER NOT NULL DEFAULT 0,
    response    BLOB
)`, `CREATE INDEX IF NOT EXISTS ` + t + `_expires_at_idx ON ` + t + ` (expires_at)`}
	}
}

// cols is the column list every statement returns, in scanRecord's order.
const cols = pgsql.Cols

// queries holds a dialect's statements for one table. The claim statements
// live next to the claim code of each dialect (postgres.go, mysql.go,
// sqlite.go).
type queries struct {
	claim       string // Postgres, SQLite: the claim; MySQL: the probe
	claimLeased string // Postgres: the claim outside a transaction
	// marked: Postgres: insert, insertLeased, claim and claimLeased,
	// each with the mark's upsert (store.ClaimRequest.Mark).
	marked        [4]string
	insert        string // MySQL; Postgres: the claim of an id never seen
	insertLeased  string // Postgres: insert outside a transaction
	insertNoWait  string // MariaDB: insert with innodb_lock_wait_timeout=0 (SET STATEMENT)
	update        string // MySQL
	read          string // plain read of the row, live or not
	causalRead    string // MariaDB Galera: read, after the node applied what the cluster committed
	get           string
	complete      string
	extend        string
	release       string
	exists        string
	isHeld        string    // MySQL: matched-row check after Complete
	isInProgress  string    // MySQL: matched-row check after Extend
	deleteExpired string    // Postgres, SQLite; MySQL: the pick of a window of expired rows
	pickAfter     string    // MySQL: the pick of the next window
	lockIDs       string    // MySQL: SELECT ... FOR UPDATE SKIP LOCKED of the ids of a JSON array
	deleteIDs     string    // MySQL: DELETE of the ids of a JSON array
	list          [4]string // List (storeutil.ListStatements)
}

func (d Dialect) queries(t string) queries {
	var q queries
	switch d {
	case Postgres:
		q = postgresQueries(t)
	case MySQL:
		q = mysqlQueries(t)
	default:
		q = sqliteQueries(t)
	}
	q.list = storeutil.ListStatements(t, d.placeholder)
	return q
}

// placeholder is the dialect's n-th statement parameter (1-based).
func (d Dialect) placeholder(n int) string {
	switch d {
	case Postgres:
		return "$" + strconv.Itoa(n)
	case MySQL:
		return "?"
	}
	return "?" + strconv.Itoa(n)
}

// timeArg converts t to the dialect's column value: microseconds since the
// epoch on SQLite, a UTC time.Time truncated to microseconds elsewhere (the
// columns keep microseconds). The zero time is NULL.
func (d Dialect) timeArg(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	if d == SQLite {
		return t.UnixMicro()
	}
	return t.UTC().Truncate(time.Microsecond)
}

// dbTime scans a timestamp column: time.Time (Postgres, MySQL with
// parseTime=true), int64 microseconds (SQLite), text (MySQL without
// parseTime, read as UTC) or NULL (the zero time).
type dbTime struct{ t *time.Time }

func (s dbTime) Scan(v any) error {
	switch v := v.(type) {
	case nil:
		*s.t = time.Time{}
	case time.Time:
		*s.t = v.UTC()
	case int64:
		*s.t = time.UnixMicro(v).UTC()
	case []byte:
		return s.parse(string(v))
	case string:
		return s.parse(v)
	default:
		return fmt.Errorf("sqlstore: cannot scan %T into a time", v)
	}
	return nil
}

func (s dbTime) parse(v string) error {
	t, err := time.ParseInLocation("2006-01-02 15:04:05.999999", v, time.UTC)
	if err != nil {
		return fmt.Errorf("sqlstore: time %q: %w", v, err)
	}
	*s.t = t
	return nil
}

type rowScanner interface{ Scan(dest ...any) error }

// scanRecord scans the columns of cols into rec, after any extra leading
// destinations. found is false when the row's columns are all NULL (an
// outer join that matched nothing).
func scanRecord(r rowScanner, rec *store.Record, extra ...any) (found bool, err error) {
	var (
		id                   []byte
		caller, scope, key   sql.NullString
		state, token, status sql.NullInt64
		attempt              sql.NullInt64
	)
	dest := append(extra, &id, &caller, &scope, &key, &rec.Fingerprint, &state, &token, &attempt,
		dbTime{&rec.LeaseUntil}, dbTime{&rec.ExpiresAt}, dbTime{&rec.CreatedAt}, &status, &rec.Response)
	if err := r.Scan(dest...); err != nil {
		return false, err
	}
	if id == nil {
		*rec = store.Record{}
		return false, nil
	}
	if len(id) != len(rec.ID) {
		return false, fmt.Errorf("sqlstore: id of %d bytes", len(id))
	}
	copy(rec.ID[:], id)
	rec.Caller, rec.Scope, rec.Key = caller.String, scope.String, key.String
	rec.State = store.State(state.Int64)
	rec.Token = token.Int64
	rec.Attempt = int(attempt.Int64)
	rec.Status = int(status.Int64)
	return true, nil
}
