package migrations_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/golang-migrate/migrate/v4"
	migratemysql "github.com/golang-migrate/migrate/v4/database/mysql"
	migratepgx "github.com/golang-migrate/migrate/v4/database/pgx/v5"
	migratesqlite "github.com/golang-migrate/migrate/v4/database/sqlite"
	"github.com/golang-migrate/migrate/v4/source/iofs"
	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/pgxstore"
	"github.com/idemkit/idem/sqlstore"
	"github.com/idemkit/idem/sqlstore/sqlstoretest"
)

// shippedVersions is how many versions sqlstore ships: 0001 the records
// table, 0002 the completer's marks table.
const shippedVersions = 2

// shipped is sqlstore's directory of migration files, as a user copies it.
var shipped = filepath.Join("..", "sqlstore", "migrations")

// A tool applies the shipped files of a dialect, all the way up or all the
// way down, on a database of its own (db is closed afterwards).
type tool struct {
	name string
	up   func(t *testing.T, d sqlstore.Dialect, db *sql.DB)
	down func(t *testing.T, d sqlstore.Dialect, db *sql.DB)
}

var tools = []tool{
	{"goose", gooseRun(true), gooseRun(false)},
	{"golang-migrate", migrateRun(true), migrateRun(false)},
}

// TestShippedMigrations: each tool, through its Go API, runs the files that
// sqlstore ships for each database unchanged; sqlstore's Check (and, on
// Postgres, pgxstore's) accepts the table it builds, Migrate after it
// changes nothing, and the tool's down migration removes the table (Check
// then fails naming the fix) and its up migration builds it again.
func TestShippedMigrations(t *testing.T) {
	for _, tl := range tools {
		t.Run(tl.name, func(t *testing.T) {
			for _, d := range []sqlstore.Dialect{sqlstore.Postgres, sqlstore.MySQL, sqlstore.SQLite} {
				t.Run(d.String(), func(t *testing.T) {
					t.Parallel()
					dsn := freshDatabase(t, d)

					tl.up(t, d, open(t, d, dsn))
					checkAccepted(t, d, dsn)

					tl.down(t, d, open(t, d, dsn))
					checkMissing(t, d, dsn)

					tl.up(t, d, open(t, d, dsn))
					checkAccepted(t, d, dsn)
				})
			}
		})
	}
}

func gooseRun(up bool) func(t *testing.T, d sqlstore.Dialect, db *sql.DB) {
	return func(t *testing.T, d sqlstore.Dialect, db *sql.DB) {
		t.Helper()
		dialect := map[sqlstore.Dialect]goose.Dialect{
			sqlstore.Postgres: goose.DialectPostgres,
			sqlstore.MySQL:    goose.DialectMySQL,
			sqlstore.SQLite:   goose.DialectSQLite3,
		}[d]
		p, err := goose.NewProvider(dialect, db, os.DirFS(filepath.Join(shipped, "goose", d.String())))
		if err != nil {
			t.Fatalf("goose.NewProvider: %v", err)
		}
		defer p.Close() // closes db
		ctx := context.Background()
		if up {
			res, err := p.Up(ctx)
			if err != nil {
				t.Fatalf("goose up: %v", err)
			}
			if len(res) != shippedVersions {
				t.Fatalf("goose up applied %d migrations, want %d", len(res), shippedVersions)
			}
		} else {
			res, err := p.DownTo(ctx, 0)
			if err != nil {
				t.Fatalf("goose down: %v", err)
			}
			if len(res) != shippedVersions {
				t.Fatalf("goose down rolled back %d migrations, want %d", len(res), shippedVersions)
			}
		}
	}
}

func migrateRun(up bool) func(t *testing.T, d sqlstore.Dialect, db *sql.DB) {
	return func(t *testing.T, d sqlstore.Dialect, db *sql.DB) {
		t.Helper()
		src, err := iofs.New(os.DirFS(filepath.Join(shipped, d.String())), ".")
		if err != nil {
			t.Fatalf("iofs.New: %v", err)
		}
		var m *migrate.Migrate
		switch d {
		case sqlstore.Postgres:
			drv, err := migratepgx.WithInstance(db, &migratepgx.Config{})
			if err != nil {
				t.Fatalf("golang-migrate pgx driver: %v", err)
			}
			m, err = migrate.NewWithInstance("iofs", src, "pgx5", drv)
			if err != nil {
				t.Fatalf("migrate.NewWithInstance: %v", err)
			}
		case sqlstore.MySQL:
			drv, err := migratemysql.WithInstance(db, &migratemysql.Config{})
			if err != nil {
				t.Fatalf("golang-migrate mysql driver: %v", err)
			}
			m, err = migrate.NewWithInstance("iofs", src, "mysql", drv)
			if err != nil {
				t.Fatalf("migrate.NewWithInstance: %v", err)
			}
		case sqlstore.SQLite:
			drv, err := migratesqlite.WithInstance(db, &migratesqlite.Config{})
			if err != nil {
				t.Fatalf("golang-migrate sqlite driver: %v", err)
			}
			m, err = migrate.NewWithInstance("iofs", src, "sqlite", drv)
			if err != nil {
				t.Fatalf("migrate.NewWithInstance: %v", err)
			}
		}
		defer m.Close() // closes db
		if up {
			err = m.Up()
		} else {
			err = m.Down()
		}
		if err != nil {
			t.Fatalf("golang-migrate (up %v): %v", up, err)
		}
		v, dirty, err := m.Version()
		switch {
		case up && (err != nil || v != shippedVersions || dirty):
			t.Fatalf("golang-migrate after up: version %d, dirty %v, %v; want version %d, clean", v, dirty, err, shippedVersions)
		case !up && !errors.Is(err, migrate.ErrNilVersion):
			t.Fatalf("golang-migrate after down: version %d, dirty %v, %v; want no version", v, dirty, err)
		}
	}
}

// checkAccepted: the stores take the table the tool built (Check claims,
// completes and reads a probe record in a transaction it rolls back), and
// Migrate on it changes nothing.
func checkAccepted(t *testing.T, d sqlstore.Dialect, dsn string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db := open(t, d, dsn)
	defer db.Close()
	store, err := sqlstore.New(db, d)
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Check(ctx); err != nil {
		t.Fatalf("sqlstore Check refused the table the tool built: %v", err)
	}
	if _, err := store.Due(ctx, time.Now(), 10); err != nil {
		t.Fatalf("the completer's marks table (0002) the tool built: %v", err)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatalf("sqlstore Migrate after the tool: %v", err)
	}
	if err := store.Check(ctx); err != nil {
		t.Fatalf("sqlstore Check after Migrate: %v", err)
	}
	if d == sqlstore.Postgres {
		pool, err := pgxpool.New(ctx, dsn)
		if err != nil {
			t.Fatal(err)
		}
		defer pool.Close()
		ps, err := pgxstore.New(pool)
		if err != nil {
			t.Fatal(err)
		}
		if err := ps.Check(ctx); err != nil {
			t.Fatalf("pgxstore Check refused the table the tool built: %v", err)
		}
	}
}

// checkMissing: after the down migration the table is gone, and Check says
// so as a configuration error.
func checkMissing(t *testing.T, d sqlstore.Dialect, dsn string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db := open(t, d, dsn)
	defer db.Close()
	store, err := sqlstore.New(db, d)
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Check(ctx); !errors.Is(err, core.ErrConfig) {
		t.Fatalf("sqlstore Check after the down migration: %v, want an error wrapping core.ErrConfig (no table)", err)
	}
}

func open(t *testing.T, d sqlstore.Dialect, dsn string) *sql.DB {
	t.Helper()
	driver := map[sqlstore.Dialect]string{sqlstore.Postgres: "pgx", sqlstore.MySQL: "mysql", sqlstore.SQLite: "sqlite"}[d]
	db, err := sql.Open(driver, dsn)
	if err != nil {
		t.Fatal(err)
	}
	return db
}

// freshDatabase returns the DSN of an empty place of the test's own: a
// schema on Postgres (search_path), a database on MySQL/MariaDB, a file on
// SQLite. The shipped files name the default table, so tests running at
// the same time (and other modules' tests on the same server) must not
// share one.
func freshDatabase(t *testing.T, d sqlstore.Dialect) string {
	t.Helper()
	var b [8]byte
	_, _ = rand.Read(b[:])
	name := "idem_mig_" + hex.EncodeToString(b[:])
	ctx := context.Background()
	switch d {
	case sqlstore.Postgres:
		base := sqlstoretest.DSN(t, sqlstoretest.EnvPostgres)
		admin := open(t, d, base)
		t.Cleanup(func() { admin.Close() })
		if _, err := admin.ExecContext(ctx, "CREATE SCHEMA "+name); err != nil {
			t.Fatalf("create schema: %v", err)
		}
		t.Cleanup(func() {
			if _, err := admin.ExecContext(context.Background(), "DROP SCHEMA "+name+" CASCADE"); err != nil {
				t.Errorf("drop schema: %v", err)
			}
		})
		u, err := url.Parse(base)
		if err != nil {
			t.Fatalf("%s is not a URL: %v", sqlstoretest.EnvPostgres, err)
		}
		q := u.Query()
		q.Set("search_path", name)
		u.RawQuery = q.Encode()
		return u.String()
	case sqlstore.MySQL:
		base := sqlstoretest.DSN(t, sqlstoretest.EnvMySQL)
		admin := open(t, d, base)
		t.Cleanup(func() { admin.Close() })
		if _, err := admin.ExecContext(ctx, "CREATE DATABASE "+name); err != nil {
			t.Fatalf("create database: %v", err)
		}
		t.Cleanup(func() {
			if _, err := admin.ExecContext(context.Background(), "DROP DATABASE "+name); err != nil {
				t.Errorf("drop database: %v", err)
			}
		})
		cfg, err := mysql.ParseDSN(base)
		if err != nil {
			t.Fatalf("%s: %v", sqlstoretest.EnvMySQL, err)
		}
		cfg.DBName = name
		return cfg.FormatDSN()
	default:
		return "file:" + filepath.Join(t.TempDir(), "idem.db") + "?_pragma=busy_timeout(5000)"
	}
}
