package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"strings"

	_ "github.com/glebarez/go-sqlite" // database/sql driver "sqlite" (pure Go; the one GORM's glebarez/sqlite uses)
	"github.com/glebarez/sqlite"
	_ "github.com/go-sql-driver/mysql" // database/sql driver "mysql"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib" // also database/sql's driver "pgx"
	"gorm.io/driver/mysql"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/idemkit/idem/core/store"
	"github.com/idemkit/idem/examples/benchrig"
	"github.com/idemkit/idem/gormstore"
	"github.com/idemkit/idem/pgxstore"
	"github.com/idemkit/idem/sqlstore"
)

// backend is the database, the idempotency store on it, the business
// repo and the simulated provider, built from the -store, -db and -dsn
// flags.
type backend struct {
	store    store.Store
	repo     repo
	provider *provider
	rig      benchrig.Backend // the benchmark mode's (-unprotected-route)
	close    func()
}

// schemaStore is what every store offers to create and check its table.
type schemaStore interface {
	Migrate(ctx context.Context) error
	Check(ctx context.Context) error
}

// dsnFor completes the DSN with the settings the stores rely on.
func dsnFor(db, dsn string) (string, error) {
	switch db {
	case "sqlite":
		if dsn == "" {
			dsn = "orders.db"
		}
		if !strings.Contains(dsn, "_pragma=") {
			sep := "?"
			if strings.Contains(dsn, "?") {
				sep = "&"
			}
			dsn += sep + "_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)&_txlock=immediate"
		}
		return dsn, nil
	case "postgres":
		if dsn == "" {
			return "", fmt.Errorf("-db postgres needs -dsn (postgres://user@host:port/db)")
		}
		return dsn, nil
	case "mysql":
		if dsn == "" {
			return "", fmt.Errorf("-db mysql needs -dsn (user:pass@tcp(host:port)/db)")
		}
		base, query, _ := strings.Cut(dsn, "?")
		v, err := url.ParseQuery(query)
		if err != nil {
			return "", fmt.Errorf("-dsn: %w", err)
		}
		v.Set("parseTime", "true")
		if v.Get("loc") == "" {
			v.Set("loc", "UTC")
		}
		if v.Get("interpolateParams") == "" {
			// One round trip per statement instead of prepare, execute
			// and close (see sqlstore's README, "Connection settings").
			v.Set("interpolateParams", "true")
		}
		return base + "?" + v.Encode(), nil
	}
	return "", fmt.Errorf("-db %q: want sqlite, postgres or mysql", db)
}

func openBackend(ctx context.Context, o options) (*backend, error) {
	dsn, err := dsnFor(o.db, o.dsn)
	if err != nil {
		return nil, err
	}
	var b *backend
	switch o.store {
	case "sql":
		b, err = openSQL(o.db, dsn)
	case "gorm":
		b, err = openGORM(o.db, dsn)
	case "pgx":
		b, err = openPGX(ctx, o.db, dsn)
	default:
		return nil, fmt.Errorf("-store %q: want gorm, sql or pgx (pgx: -db postgres only)", o.store)
	}
	if err != nil {
		return nil, err
	}
	st := b.store.(schemaStore)
	err = st.Migrate(ctx)
	if err == nil {
		// The dialect matches the server, the table has the store's shape:
		// a misconfiguration stops the start, naming the fix, instead of
		// answering 503 at the first request.
		err = st.Check(ctx)
	}
	if err == nil {
		err = migrate(ctx, b.provider.db, b.provider.dialect)
	}
	if err != nil {
		b.close()
		return nil, err
	}
	return b, nil
}

func openSQL(db, dsn string) (*backend, error) {
	driver, dialect := map[string]string{"sqlite": "sqlite", "postgres": "pgx", "mysql": "mysql"}[db],
		map[string]sqlstore.Dialect{"sqlite": sqlstore.SQLite, "postgres": sqlstore.Postgres, "mysql": sqlstore.MySQL}[db]
	sdb, err := sql.Open(driver, dsn)
	if err != nil {
		return nil, err
	}
	tunePool(sdb)
	st, err := sqlstore.New(sdb, dialect)
	if err != nil {
		sdb.Close()
		return nil, err
	}
	return &backend{store: st, repo: &sqlRepo{db: sdb, dialect: db}, provider: &provider{db: sdb, dialect: db},
		rig: benchrig.SQL(sdb, db), close: func() { sdb.Close() }}, nil
}

func openGORM(db, dsn string) (*backend, error) {
	var d gorm.Dialector
	switch db {
	case "sqlite":
		d = sqlite.Open(dsn)
	case "postgres":
		d = postgres.Open(dsn)
	case "mysql":
		// GORM on MariaDB adds RETURNING to inserts; the plain MySQL
		// dialect keeps inserts portable to MySQL 8.
		d = mysql.New(mysql.Config{DSN: dsn, DisableWithReturning: true})
	}
	gdb, err := gorm.Open(d, &gorm.Config{Logger: logger.Discard})
	if err != nil {
		return nil, err
	}
	sdb, err := gdb.DB()
	if err != nil {
		return nil, err
	}
	tunePool(sdb)
	// The repository writes through gdb.WithContext(ctx); the plugin runs
	// those statements in the request's transaction in atomic mode.
	err = gdb.Use(gormstore.Plugin())
	var st *gormstore.Store
	if err == nil {
		st, err = gormstore.New(gdb)
	}
	if err != nil {
		sdb.Close()
		return nil, err
	}
	return &backend{store: st, repo: &gormRepo{db: gdb}, provider: &provider{db: sdb, dialect: db},
		rig: benchrig.GORM(gdb, db), close: func() { sdb.Close() }}, nil
}

// openPGX is the pgx backend: a pgxpool of maxConns connections, pgxstore
// on it, and the business repo and the provider on the same pool.
func openPGX(ctx context.Context, db, dsn string) (*backend, error) {
	if db != "postgres" {
		return nil, errors.New("-store pgx needs -db postgres")
	}
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = maxConns
	cfg.MinConns = maxConns
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	st, err := pgxstore.New(pool)
	if err != nil {
		pool.Close()
		return nil, err
	}
	sdb := stdlib.OpenDBFromPool(pool)
	return &backend{store: st, repo: &pgxRepo{sqlRepo: &sqlRepo{db: sdb, dialect: db}, pool: pool}, provider: &provider{db: sdb, dialect: db},
		rig: benchrig.PGX(pool), close: pool.Close}, nil
}

// maxConns bounds the service's database connections; all of them stay
// open when idle. database/sql keeps only 2 idle connections by default,
// so under concurrent load every request beyond the second would open a
// new connection (on Postgres, a new server process) and close it again.
const maxConns = 16

func tunePool(db *sql.DB) {
	db.SetMaxOpenConns(maxConns)
	db.SetMaxIdleConns(maxConns)
}
