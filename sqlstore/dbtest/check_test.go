package dbtest_test

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"testing"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/sqlstore"
	"github.com/idemkit/idem/sqlstore/sqlstoretest"
)

// wantConfigError fails unless err wraps core.ErrConfig and says every
// part.
func wantConfigError(t *testing.T, what string, err error, parts ...string) {
	t.Helper()
	if !errors.Is(err, core.ErrConfig) {
		t.Fatalf("%s: error %v, want core.ErrConfig", what, err)
	}
	t.Logf("%s: %v", what, err)
	for _, p := range parts {
		if !strings.Contains(err.Error(), p) {
			t.Errorf("%s: error %q does not say %q", what, err, p)
		}
	}
}

// TestCheckFindsAWrongDialect: a store whose dialect is not the server's
// fails Check and Migrate with core.ErrConfig naming the server and the
// dialect to use, for every wrong pairing on real servers.
func TestCheckFindsAWrongDialect(t *testing.T) {
	servers := map[sqlstore.Dialect]string{sqlstore.Postgres: "PostgreSQL", sqlstore.MySQL: "MariaDB", sqlstore.SQLite: "SQLite"}
	names := map[sqlstore.Dialect]string{sqlstore.Postgres: "sqlstore.Postgres", sqlstore.MySQL: "sqlstore.MySQL", sqlstore.SQLite: "sqlstore.SQLite"}
	ctx := context.Background()
	for _, server := range dialects {
		for _, wrong := range dialects {
			if wrong == server {
				continue
			}
			t.Run(server.String()+"/"+wrong.String(), func(t *testing.T) {
				db, _ := openDB(t, server)
				s, err := sqlstore.New(db, wrong, sqlstore.WithTable(sqlstoretest.Table()))
				if err != nil {
					t.Fatal(err)
				}
				want := []string{"the server is " + servers[server], "created with " + names[wrong], "use " + names[server]}
				wantConfigError(t, "Check", s.Check(ctx), want...)
				wantConfigError(t, "Migrate", s.Migrate(ctx), want...)
			})
		}
	}
}

// TestCheckFindsABadTable: Check passes on a migrated table and fails with
// core.ErrConfig naming the fix when the table is missing, lacks a column,
// or has no primary key on id.
func TestCheckFindsABadTable(t *testing.T) {
	ctx := context.Background()
	for _, d := range dialects {
		t.Run(d.String(), func(t *testing.T) {
			t.Run("Migrated", func(t *testing.T) {
				s, _, _ := newStore(t, d)
				if err := s.Check(ctx); err != nil {
					t.Fatalf("Check on a migrated table: %v", err)
				}
			})
			t.Run("MissingTable", func(t *testing.T) {
				db, _ := openDB(t, d)
				s, err := sqlstore.New(db, d, sqlstore.WithTable(sqlstoretest.Table()))
				if err != nil {
					t.Fatal(err)
				}
				wantConfigError(t, "Check", s.Check(ctx), s.Table(), "run store.Migrate(ctx)")
			})
			t.Run("MissingColumn", func(t *testing.T) {
				s, db, _ := newStore(t, d)
				if _, err := db.ExecContext(ctx, "ALTER TABLE "+s.Table()+" DROP COLUMN response"); err != nil {
					t.Fatal(err)
				}
				wantConfigError(t, "Check", s.Check(ctx), "lacks the column(s) response", "store.Migrate(ctx)")
			})
			t.Run("NoPrimaryKey", func(t *testing.T) {
				db, _ := openDB(t, d)
				table := sqlstoretest.Table()
				ddl := strings.Replace(sqlstore.Schema(d, table), "NOT NULL PRIMARY KEY", "NOT NULL", 1)
				for _, stmt := range strings.Split(ddl, ";") {
					if strings.TrimSpace(stmt) == "" {
						continue
					}
					if _, err := db.ExecContext(ctx, stmt); err != nil {
						t.Fatal(err)
					}
				}
				t.Cleanup(func() { _, _ = db.ExecContext(context.Background(), "DROP TABLE IF EXISTS "+table) })
				s, err := sqlstore.New(db, d, sqlstore.WithTable(table))
				if err != nil {
					t.Fatal(err)
				}
				wantConfigError(t, "Check", s.Check(ctx), "primary key ()", "needs (id)")
			})
		})
	}
}

// TestCheckOnAnUnreachableServer: a server that cannot be reached is not a
// misconfiguration: core.ErrStoreUnavailable.
func TestCheckOnAnUnreachableServer(t *testing.T) {
	s, _, _ := newStore(t, sqlstore.SQLite)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := s.Check(ctx); !errors.Is(err, core.ErrStoreUnavailable) {
		t.Fatalf("Check with a cancelled context: %v, want core.ErrStoreUnavailable", err)
	}
}

// TestCheckFindsAWrongColumnType: a table with the store's columns and
// primary key, but a column type the store's records do not fit (a text
// id where the store writes 32 bytes), fails Check with core.ErrConfig
// naming the schema, instead of passing and failing every request with 503.
func TestCheckFindsAWrongColumnType(t *testing.T) {
	ctx := context.Background()
	for _, c := range []struct {
		d        sqlstore.Dialect
		old, new string
	}{
		{sqlstore.Postgres, "id          BYTEA        NOT NULL PRIMARY KEY", "id TEXT NOT NULL PRIMARY KEY"},
		{sqlstore.MySQL, "id          BINARY(32)   NOT NULL PRIMARY KEY", "id VARCHAR(64) CHARACTER SET utf8mb4 NOT NULL PRIMARY KEY"},
		// A time column that keeps the date only: every record would
		// read as expired (or a lease as lapsed) on its first retry.
		{sqlstore.Postgres, "expires_at  TIMESTAMPTZ  NOT NULL", "expires_at DATE NOT NULL"},
		{sqlstore.MySQL, "expires_at  DATETIME(6)  NOT NULL", "expires_at DATE NOT NULL"},
		{sqlstore.Postgres, "lease_until TIMESTAMPTZ,", "lease_until DATE,"},
		{sqlstore.MySQL, "lease_until DATETIME(6),", "lease_until DATE,"},
	} {
		t.Run(c.d.String()+"/"+strings.Fields(c.new)[0]+"_"+strings.Trim(strings.Fields(c.new)[1], ",()0123456789"), func(t *testing.T) {
			db, _ := openDB(t, c.d)
			table := sqlstoretest.Table()
			ddl := sqlstore.Schema(c.d, table)
			if !strings.Contains(ddl, c.old) {
				t.Fatalf("the schema has no %q", c.old)
			}
			for _, stmt := range strings.Split(strings.ReplaceAll(ddl, c.old, c.new), ";") {
				if strings.TrimSpace(stmt) == "" {
					continue
				}
				if _, err := db.ExecContext(ctx, stmt); err != nil {
					t.Fatal(err)
				}
			}
			t.Cleanup(func() { _, _ = db.ExecContext(context.Background(), "DROP TABLE IF EXISTS "+table) })
			s, err := sqlstore.New(db, c.d, sqlstore.WithTable(table))
			if err != nil {
				t.Fatal(err)
			}
			wantConfigError(t, "Check", s.Check(ctx), table, "sqlstore.Schema")
			var n int
			if err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM "+table).Scan(&n); err != nil || n != 0 {
				t.Errorf("Check left %d rows (%v), want none", n, err)
			}
		})
	}
}

// TestMySQLSerializableRefused: on MySQL/MariaDB at SERIALIZABLE InnoDB
// reads with locks, so a claim's read of an id another transaction is
// claiming would wait for it instead of answering in progress at once.
// The store refuses the level loudly: New, when WithTxOptions names it;
// Check, when Begin uses the session's default and the session runs at
// SERIALIZABLE. Both errors wrap core.ErrConfig and name the fix.
func TestMySQLSerializableRefused(t *testing.T) {
	db, _ := openDB(t, sqlstore.MySQL)
	_, err := sqlstore.New(db, sqlstore.MySQL, sqlstore.WithTxOptions(&sql.TxOptions{Isolation: sql.LevelSerializable}))
	wantConfigError(t, "New at SERIALIZABLE", err, "SERIALIZABLE", "READ COMMITTED", "WithTxOptions")

	db.SetMaxOpenConns(1) // one session, whose default is set below
	ctx := context.Background()
	if _, err := db.ExecContext(ctx, "SET SESSION TRANSACTION ISOLATION LEVEL SERIALIZABLE"); err != nil {
		t.Fatal(err)
	}
	s, err := sqlstore.New(db, sqlstore.MySQL, sqlstore.WithTable(sqlstoretest.Table()), sqlstore.WithTxOptions(&sql.TxOptions{}))
	if err != nil {
		t.Fatal(err)
	}
	wantConfigError(t, "Check with the session at SERIALIZABLE", s.Check(ctx), "SERIALIZABLE", "READ COMMITTED", "transaction_isolation")

	// The same session at READ COMMITTED passes that check (the table is
	// missing: Check goes on and reports that instead).
	if _, err := db.ExecContext(ctx, "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED"); err != nil {
		t.Fatal(err)
	}
	if err := s.Check(ctx); err == nil || strings.Contains(err.Error(), "SERIALIZABLE") {
		t.Fatalf("Check at READ COMMITTED on a missing table: %v, want the missing table reported", err)
	}
}
