package reliability

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"flag"
	"path/filepath"
	"testing"
	"time"

	gosqlite "github.com/glebarez/go-sqlite"
	gormsqlite "github.com/glebarez/sqlite"
	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	gormmysql "gorm.io/driver/mysql"
	gormpostgres "gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/idemkit/idem/gormstore"
	"github.com/idemkit/idem/pgxstore"
	"github.com/idemkit/idem/sqlstore"
	"github.com/idemkit/idem/sqlstore/sqlstoretest"
)

var (
	long     = flag.Bool("reliability.long", false, "run the long variants (minutes per store)")
	duration = flag.Duration("reliability.duration", 2*time.Minute, "how long each long variant runs")
	seedFlag = flag.Uint64("reliability.seed", 0, "seed of the random schedules (0: a new one, printed)")
)

const sqliteOpts = "?_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)&_txlock=immediate"

var sqlDialects = []sqlstore.Dialect{sqlstore.Postgres, sqlstore.MySQL, sqlstore.SQLite}

// dsn returns the DSN of d's test database (a fresh file for SQLite); a
// missing one skips t, or fails it under CI and IDEM_REQUIRE_DB.
func dsn(t testing.TB, d sqlstore.Dialect) string {
	t.Helper()
	switch d {
	case sqlstore.Postgres:
		return sqlstoretest.DSN(t, sqlstoretest.EnvPostgres)
	case sqlstore.MySQL:
		return sqlstoretest.DSN(t, sqlstoretest.EnvMySQL)
	}
	return "file:" + filepath.Join(t.TempDir(), "idem.db") + sqliteOpts
}

// openDB opens a pool on d's test database through dial (nil: directly),
// closed at cleanup.
func openDB(t testing.TB, d sqlstore.Dialect, dsnStr string) *sql.DB {
	t.Helper()
	var db *sql.DB
	switch d {
	case sqlstore.Postgres:
		cfg, err := pgx.ParseConfig(dsnStr)
		if err != nil {
			t.Fatal(err)
		}
		db = stdlib.OpenDB(*cfg)
	case sqlstore.MySQL:
		cfg, err := mysql.ParseDSN(dsnStr)
		if err != nil {
			t.Fatal(err)
		}
		c, err := mysql.NewConnector(cfg)
		if err != nil {
			t.Fatal(err)
		}
		db = sql.OpenDB(c)
	default:
		// glebarez/go-sqlite (a fork of modernc.org/sqlite that GORM's
		// pure-Go dialector needs; the two cannot be linked together).
		db = sql.OpenDB(sqliteConnector{dsnStr})
	}
	t.Cleanup(func() { db.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := db.PingContext(ctx); err != nil {
		t.Fatalf("%v: %v", d, err)
	}
	return db
}

type sqliteConnector struct{ dsn string }

func (c sqliteConnector) Connect(context.Context) (driver.Conn, error) {
	return (&gosqlite.Driver{}).Open(c.dsn)
}
func (c sqliteConnector) Driver() driver.Driver { return &gosqlite.Driver{} }

// newSQLStore returns a store on a fresh table of db, dropped at cleanup
// (through admin, a pool that no fault reaches; nil: db).
func newSQLStore(t testing.TB, d sqlstore.Dialect, db, admin *sql.DB) *sqlstore.Store {
	t.Helper()
	if admin == nil {
		admin = db
	}
	table := sqlstoretest.Table()
	s, err := sqlstore.New(db, d, sqlstore.WithTable(table))
	if err != nil {
		t.Fatal(err)
	}
	newSQLStoreOn(t, d, admin, table)
	return s
}

// newSQLStoreOn migrates table through admin and drops it at cleanup.
func newSQLStoreOn(t testing.TB, d sqlstore.Dialect, admin *sql.DB, table string) *sqlstore.Store {
	t.Helper()
	as, err := sqlstore.New(admin, d, sqlstore.WithTable(table))
	if err != nil {
		t.Fatal(err)
	}
	if err := as.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, tb := range []string{table, table + "_marks"} {
			if _, err := admin.ExecContext(context.Background(), "DROP TABLE IF EXISTS "+tb); err != nil {
				t.Errorf("drop %s: %v", tb, err)
			}
		}
	})
	return as
}

// newPgxStore returns a pgxstore on a fresh table, over a pgx pool of 12
// connections on dsnStr, created (with sqlstore's Migrate: the table is
// the same) and dropped at cleanup through admin, a pool no fault reaches.
// The pool sends every statement's text (QueryExecModeExec, no statement
// cache), so the fault proxy sees each COMMIT, pipelined or not.
func newPgxStore(t testing.TB, dsnStr string, admin *sql.DB) *pgxstore.Store {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(dsnStr)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 12
	cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	table := sqlstoretest.Table()
	_ = newSQLStoreOn(t, sqlstore.Postgres, admin, table)
	s, err := pgxstore.New(pool, pgxstore.WithTable(table))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// newGormStore returns a gormstore on a fresh table, over GORM opened on
// the pool db (dropped at cleanup).
func newGormStore(t testing.TB, d sqlstore.Dialect, db *sql.DB) *gormstore.Store {
	t.Helper()
	var dialector gorm.Dialector
	switch d {
	case sqlstore.Postgres:
		dialector = gormpostgres.New(gormpostgres.Config{Conn: db})
	case sqlstore.MySQL:
		dialector = gormmysql.New(gormmysql.Config{Conn: db, DisableWithReturning: true})
	default:
		dialector = gormsqlite.Dialector{Conn: db}
	}
	gdb, err := gorm.Open(dialector, &gorm.Config{Logger: logger.Discard})
	if err != nil {
		t.Fatalf("%v: %v", d, err)
	}
	table := sqlstoretest.Table()
	s, err := gormstore.New(gdb, gormstore.WithTable(table))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, tb := range []string{table, table + "_marks"} {
			if _, err := db.ExecContext(context.Background(), "DROP TABLE IF EXISTS "+tb); err != nil {
				t.Errorf("drop %s: %v", tb, err)
			}
		}
	})
	return s
}
