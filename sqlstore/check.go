package sqlstore

import (
	"context"
	"crypto/rand"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/store"
)

// Check verifies, at start-up, that the store can work: the server it talks
// to is the one its dialect writes SQL for (Postgres, MySQL/MariaDB or
// SQLite, in a supported version), and the table exists with the columns
// and the primary key the store needs. Call it after Migrate (or after your
// migration tool ran), before serving:
//
//	if err := store.Check(ctx); err != nil {
//		log.Fatal(err) // names the fix: "run store.Migrate", "use sqlstore.MySQL", ...
//	}
//
// A misconfiguration is an error wrapping core.ErrConfig whose text names
// the fix; a server that cannot be reached is an error wrapping
// core.ErrStoreUnavailable. Check runs a few catalog queries, then claims,
// completes and reads one probe record in a transaction that it rolls back
// (so a column whose type does not fit the store's records is found too);
// it leaves nothing behind. With WithRequireSyncWait it also checks, on a
// MariaDB Galera node, that the connection reads with wsrep_sync_wait=1.
func (s *Store) Check(ctx context.Context) error {
	c, inTx, err := s.conn(ctx)
	if err != nil {
		return err
	}
	if err := s.checkServer(ctx, c); err != nil {
		return err
	}
	if err := s.checkSyncWait(ctx, c); err != nil {
		return err
	}
	if err := s.checkIsolation(ctx, c); err != nil {
		return err
	}
	if err := s.checkTable(ctx, c); err != nil {
		return err
	}
	if inTx {
		return nil // the caller's transaction: write nothing in it
	}
	return s.checkRecords(ctx)
}

// checkRecords writes a probe record the way the engine does (Claim,
// Complete, Get) in a transaction it rolls back.
func (s *Store) checkRecords(ctx context.Context) error {
	tctx, tx, err := s.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback() }()
	var id store.ID
	if _, err := rand.Read(id[:]); err != nil {
		return err
	}
	now := time.Now().UTC().Truncate(time.Second)
	const token = 1
	fail := func(op string, err error) error {
		return fmt.Errorf("%w: sqlstore: table %q does not take the store's records (%s failed; are its column types those of sqlstore.Schema(%s, %q)?): %v",
			core.ErrConfig, s.table, op, dialectName(s.d), s.table, err) // %v: a configuration error, not a store to retry
	}
	expires, lease := now.Add(time.Hour), now.Add(time.Minute).Add(123456*time.Microsecond)
	res, err := s.Claim(tctx, store.ClaimRequest{ID: id, Caller: "idem/check", Scope: "idem/check", Key: "idem/check",
		Fingerprint: id[:], Token: token, Now: now, ExpiresAt: expires, LeaseUntil: lease})
	if err != nil {
		return fail("claim", err)
	}
	if !res.Claimed {
		return fail("claim", errors.New("a new record was not claimed"))
	}
	// The times read back as written, to the microsecond (a DATE column,
	// or one without fractional seconds, would make every lease lapse or
	// every record expire early).
	rec, err := s.Get(tctx, id, now)
	if err != nil {
		return fail("get", err)
	}
	if !rec.ExpiresAt.Equal(expires) || !rec.LeaseUntil.Equal(lease) {
		return fail("get", fmt.Errorf("the times read back differ: expires_at %v (wrote %v), lease_until %v (wrote %v)",
			rec.ExpiresAt, expires, rec.LeaseUntil, lease))
	}
	err = s.Complete(tctx, id, token, store.Completion{State: store.StateCompleted, Status: 201, Response: []byte{0, 0xff, 1}, ExpiresAt: expires})
	if err != nil {
		return fail("complete", err)
	}
	rec, err = s.Get(tctx, id, now)
	if err != nil {
		return fail("get", err)
	}
	if rec.ID != id || rec.State != store.StateCompleted || rec.Status != 201 || string(rec.Response) != "\x00\xff\x01" {
		return fail("get", fmt.Errorf("the record read back differs: %+v", rec))
	}
	return nil
}

// erUnknownSystemVariable: MySQL (without Galera) has no @@wsrep_on.
const erUnknownSystemVariable = 1193

// checkSyncWait fails, under WithRequireSyncWait, when the server is a
// Galera node and the session reads without wsrep_sync_wait's READ bit.
func (s *Store) checkSyncWait(ctx context.Context, c Conn) error {
	if !s.syncWait || s.d != MySQL {
		return nil
	}
	var on, wait int64
	err := c.QueryRowContext(ctx, `SELECT @@session.wsrep_on, @@session.wsrep_sync_wait`).Scan(&on, &wait)
	switch {
	case mysqlErrno(err) == erUnknownSystemVariable:
		return nil // not a server with wsrep: nothing to require
	case err != nil:
		return unavailable("check: wsrep_sync_wait", err)
	case on == 0 || wait&1 != 0:
		return nil
	}
	return fmt.Errorf("%w: sqlstore: the server is a Galera node and this connection reads with wsrep_sync_wait=%d, so a node may not see what another committed (WithRequireSyncWait): add wsrep_sync_wait=1 to the DSN (go-sql-driver/mysql: &wsrep_sync_wait=1), or drop the option",
		core.ErrConfig, wait)
}

var (
	_ store.MultiPrimary = (*Store)(nil)
	_ store.Embedded     = (*Store)(nil)
)

// Embedded implements store.Embedded: true on SQLite, whose database runs
// in the process with one writer, so core.MarkEffect writes no effect
// guard there (it would wait for the attempt's own transaction).
func (s *Store) Embedded() bool { return s.d == SQLite }

// MultiPrimary implements store.MultiPrimary: on MySQL/MariaDB it asks
// the server whether it replicates with wsrep (@@wsrep_on: a MariaDB
// Galera node, where every node takes writes), unless WithOneWriterNode
// says that every write goes through one node. Postgres and SQLite are
// single-primary: false, without a statement.
func (s *Store) MultiPrimary(ctx context.Context) (bool, error) {
	if s.d != MySQL || s.oneWriter {
		return false, nil
	}
	c, _, err := s.conn(ctx)
	if err != nil {
		return false, err
	}
	return s.multiPrimary(ctx, c)
}

// multiPrimary is MultiPrimary's question, asked on c.
func (s *Store) multiPrimary(ctx context.Context, c Conn) (bool, error) {
	if s.d != MySQL || s.oneWriter {
		return false, nil
	}
	var on int64
	err := c.QueryRowContext(ctx, `SELECT @@wsrep_on`).Scan(&on)
	switch {
	case mysqlErrno(err) == erUnknownSystemVariable:
		return false, nil // MySQL without wsrep
	case err != nil:
		return false, unavailable("multi-primary: wsrep_on", err)
	}
	return on != 0, nil
}

// server is what a database answered about itself.
type server struct {
	dialect Dialect
	name    string // "PostgreSQL", "MariaDB", "MySQL", "SQLite"
	version string
}

func (v server) String() string { return v.name + " " + v.version }

// minimum versions, by server name: the oldest each dialect's SQL runs on.
var minimum = map[string][2]int{
	"PostgreSQL": {12, 0},
	"MySQL":      {8, 0},
	"MariaDB":    {10, 6},
	"SQLite":     {3, 35},
}

// identify asks the server what it is: version() answers on Postgres and
// MySQL/MariaDB, sqlite_version() on SQLite.
func identify(ctx context.Context, c Conn) (server, error) {
	var v string
	err := c.QueryRowContext(ctx, `SELECT version()`).Scan(&v)
	if err != nil {
		if lerr := c.QueryRowContext(ctx, `SELECT sqlite_version()`).Scan(&v); lerr != nil {
			return server{}, unavailable("check: reading the server version", err)
		}
		return server{SQLite, "SQLite", v}, nil
	}
	switch {
	case strings.HasPrefix(v, "PostgreSQL "):
		f := strings.Fields(v)
		return server{Postgres, "PostgreSQL", strings.TrimSuffix(f[1], ",")}, nil
	case strings.Contains(v, "MariaDB"):
		ver, _, _ := strings.Cut(v, "-")
		return server{MySQL, "MariaDB", ver}, nil
	case len(v) > 0 && '0' <= v[0] && v[0] <= '9':
		ver, _, _ := strings.Cut(v, "-")
		return server{MySQL, "MySQL", ver}, nil
	}
	return server{}, fmt.Errorf("%w: sqlstore: unknown database server %q: the store supports PostgreSQL, MySQL/MariaDB and SQLite", core.ErrConfig, v)
}

// dialectName is how the code names d.
func dialectName(d Dialect) string {
	switch d {
	case Postgres:
		return "sqlstore.Postgres"
	case MySQL:
		return "sqlstore.MySQL"
	case SQLite:
		return "sqlstore.SQLite"
	}
	return d.String()
}

// checkIsolation fails on MySQL/MariaDB when Begin's transactions would
// run at SERIALIZABLE (errMySQLSerializable): New refuses the level when
// WithTxOptions names it; with the session's default
// (WithTxOptions(&sql.TxOptions{})) the session's transaction_isolation
// decides (tx_isolation on servers that do not know the newer name).
func (s *Store) checkIsolation(ctx context.Context, c Conn) error {
	if s.d != MySQL || s.txOpts == nil || s.txOpts.Isolation != sql.LevelDefault {
		return nil
	}
	var level string
	err := c.QueryRowContext(ctx, `SELECT @@session.transaction_isolation`).Scan(&level)
	if err != nil {
		err = c.QueryRowContext(ctx, `SELECT @@session.tx_isolation`).Scan(&level)
	}
	if err != nil {
		return unavailable("check isolation", err)
	}
	if strings.EqualFold(strings.ReplaceAll(level, "_", "-"), "SERIALIZABLE") {
		return errMySQLSerializable
	}
	return nil
}

// checkServer fails when the server is not the one the dialect is for, or
// older than the dialect needs.
func (s *Store) checkServer(ctx context.Context, c Conn) error {
	srv, err := identify(ctx, c)
	if err != nil {
		return err
	}
	if srv.dialect != s.d {
		return fmt.Errorf("%w: sqlstore: the server is %v but the store was created with %s: use %s (with GORM, open the matching gorm.Dialector)",
			core.ErrConfig, srv, dialectName(s.d), dialectName(srv.dialect))
	}
	if min, ok := minimum[srv.name]; ok && versionLess(srv.version, min) {
		return fmt.Errorf("%w: sqlstore: the server is %v; %s needs %s %d.%d or later", core.ErrConfig, srv, dialectName(s.d), srv.name, min[0], min[1])
	}
	return nil
}

// versionLess reports whether version "major.minor[.patch...]" is older
// than min; a version it cannot read is not.
func versionLess(version string, min [2]int) bool {
	parts := strings.SplitN(version, ".", 3)
	if len(parts) < 2 {
		return false
	}
	major, err1 := strconv.Atoi(parts[0])
	minor, err2 := strconv.Atoi(strings.TrimRightFunc(parts[1], func(r rune) bool { return r < '0' || r > '9' }))
	if err1 != nil || err2 != nil {
		return false
	}
	return major < min[0] || major == min[0] && minor < min[1]
}

// requiredColumns are the columns every statement of the store uses.
var requiredColumns = strings.Split(strings.ReplaceAll(cols, " ", ""), ",")

// checkTable fails when the table is missing, lacks a column, or its
// primary key is not (id).
func (s *Store) checkTable(ctx context.Context, c Conn) error {
	migrate := fmt.Sprintf("run store.Migrate(ctx), or apply sqlstore.Schema(%s, %q) (migrations/%s) with your migration tool", dialectName(s.d), s.table, s.d)
	rows, err := c.QueryContext(ctx, `SELECT * FROM `+s.table+` WHERE 1 = 0`)
	if err != nil {
		return fmt.Errorf("%w: sqlstore: table %q cannot be read (missing?): %s: %v", core.ErrConfig, s.table, migrate, err)
	}
	have, err := rows.Columns()
	_ = rows.Close()
	if err != nil {
		return unavailable("check: columns", err)
	}
	for i := range have {
		have[i] = strings.ToLower(have[i])
	}
	var missing []string
	for _, col := range requiredColumns {
		if !slices.Contains(have, col) {
			missing = append(missing, col)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("%w: sqlstore: table %q lacks the column(s) %s that the store needs: it was not made by this version's Schema; migrate it to sqlstore.Schema(%s, %q), or drop it and run store.Migrate(ctx)",
			core.ErrConfig, s.table, strings.Join(missing, ", "), dialectName(s.d), s.table)
	}
	pk, err := s.primaryKey(ctx, c)
	if err != nil {
		return unavailable("check: primary key", err)
	}
	if !slices.Equal(pk, []string{"id"}) {
		return fmt.Errorf("%w: sqlstore: table %q has the primary key (%s), the store needs (id): without it duplicates are not detected; recreate it with sqlstore.Schema(%s, %q) or store.Migrate(ctx)",
			core.ErrConfig, s.table, strings.Join(pk, ", "), dialectName(s.d), s.table)
	}
	return nil
}

// primaryKey returns the lower-cased columns of the table's primary key.
func (s *Store) primaryKey(ctx context.Context, c Conn) ([]string, error) {
	var q string
	var arg any = s.table
	switch s.d {
	case Postgres:
		q = `SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)
WHERE i.indrelid = to_regclass($1) AND i.indisprimary`
		arg = strings.ToLower(s.table)
	case MySQL:
		q = `SELECT column_name FROM information_schema.key_column_usage
WHERE table_schema = DATABASE() AND table_name = ? AND constraint_name = 'PRIMARY' ORDER BY ordinal_position`
	default:
		q = `SELECT name FROM pragma_table_info(?) WHERE pk > 0 ORDER BY pk`
	}
	rows, err := c.QueryContext(ctx, q, arg)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var pk []string
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			return nil, err
		}
		pk = append(pk, strings.ToLower(name))
	}
	return pk, rows.Err()
}
