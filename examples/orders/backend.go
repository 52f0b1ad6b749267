package main

import (
	"context"
	"database/sql"
	"fmt"
	"net/url"
	"strings"

	_ "github.com/glebarez/go-sqlite" // database/sql driver "sqlite" (pure Go; the one GORM's glebarez/sqlite uses)
	"github.com/glebarez/sqlite"
	_ "github.com/go-sql-driver/mysql" // database/sql driver "mysql"
	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"
	"gorm.io/driver/mysql"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/gormstore"
	"github.com/idemkit/idem/sqlstore"
)

// backend is the database, the idempotency store on it and the business
// repo, built from the -store, -db and -dsn flags.
type backend struct {
	store core.Store
	repo  repo
	begin txBeginner // the business transaction of -unprotected-route
	close func()
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
	switch o.store {
	case "sql":
		return openSQL(ctx, o.db, dsn)
	case "gorm":
		return openGORM(ctx, o.db, dsn)
	case "pgx":
		return openPGX(ctx, o.db, dsn)
	}
	return nil, fmt.Errorf("-store %q: want gorm, sql or pgx (pgx: -db postgres only)", o.store)
}

func openSQL(ctx context.Context, db, dsn string) (*backend, error) {
	driver, dialect := map[string]string{"sqlite": "sqlite", "postgres": "pgx", "mysql": "mysql"}[db],
		map[string]sqlstore.Dialect{"sqlite": sqlstore.SQLite, "postgres": sqlstore.Postgres, "mysql": sqlstore.MySQL}[db]
	sdb, err := sql.Open(driver, dsn)
	if err != nil {
		return nil, err
	}
	tunePool(sdb)
	if err := sdb.PingContext(ctx); err != nil {
		sdb.Close()
		return nil, err
	}
	st, err := sqlstore.New(sdb, dialect)
	if err == nil {
		err = st.Migrate(ctx)
	}
	if err == nil {
		// The dialect matches the server, the table has the store's shape:
		// a misconfiguration stops the start, naming the fix, instead of
		// answering 503 at the first request.
		err = st.Check(ctx)
	}
	r := &sqlRepo{db: sdb, dialect: db}
	if err == nil {
		err = r.migrate(ctx)
	}
	if err != nil {
		sdb.Close()
		return nil, err
	}
	return &backend{store: st, repo: r, begin: sqlTx(sdb, db), close: func() { sdb.Close() }}, nil
}

func openGORM(ctx context.Context, db, dsn string) (*backend, error) {
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
	// The repository writes through gdb.WithContext(ctx); the plugin runs
	// those statements in the request's transaction in atomic mode.
	if err := gdb.Use(gormstore.Plugin()); err != nil {
		return nil, err
	}
	sdb, err := gdb.DB()
	if err != nil {
		return nil, err
	}
	tunePool(sdb)
	st, err := gormstore.New(gdb)
	if err == nil {
		err = st.Migrate(ctx)
	}
	if err == nil {
		err = st.Check(ctx) // see openSQL
	}
	r := &gormRepo{db: gdb, dialect: db}
	if err == nil {
		err = r.migrate(ctx)
	}
	if err != nil {
		sdb.Close()
		return nil, err
	}
	return &backend{store: st, repo: r, begin: gormTx(gdb, db), close: func() { sdb.Close() }}, nil
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
