package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"

	_ "github.com/glebarez/go-sqlite" // database/sql driver "sqlite" (pure Go; the one GORM's glebarez/sqlite uses)
	"github.com/glebarez/sqlite"
	mysqldriver "github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib" // also database/sql's driver "pgx"
	"gorm.io/driver/mysql"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/idemkit/idem/core/store"
	"github.com/idemkit/idem/core/syncclock"
	"github.com/idemkit/idem/examples/benchrig"
	"github.com/idemkit/idem/examples/internal/fakepay"
	"github.com/idemkit/idem/gormstore"
	"github.com/idemkit/idem/pgxstore"
	"github.com/idemkit/idem/sqlstore"
)

// backend is the database, the idempotency store on it, the business repo
// and the simulated provider, built from the -store, -db and -dsn flags.
type backend struct {
	store    idemStore
	repo     repo
	db       *sql.DB // the business tables' (migrate)
	provider *fakepay.Provider
	rig      benchrig.Backend // the benchmark rig's (-unprotected-route)
	close    func()
}

// idemStore is what the service uses of its store (sqlstore, gormstore
// and pgxstore have all of it).
type idemStore interface {
	store.Settler        // the completer settles its marked records
	store.TxStore        // WithoutTx: the payment's read outside the transaction
	syncclock.TimeSource // the database's clock
	Migrate(ctx context.Context) error
	Check(ctx context.Context) error
}

func openBackend(ctx context.Context, o options) (*backend, error) {
	var b *backend
	var err error
	switch o.store {
	case "sql", "gorm":
		b, err = openSQL(o.store, o.db, o.dsn)
	case "pgx":
		b, err = openPGX(ctx, o.db, o.dsn)
	default:
		return nil, fmt.Errorf("-store %q: want gorm, sql or pgx (pgx: -db postgres only)", o.store)
	}
	if err != nil {
		return nil, err
	}
	err = b.store.Migrate(ctx)
	if err == nil {
		// The dialect matches the server, the table has the store's shape:
		// a misconfiguration stops the start, naming the fix, instead of
		// answering 503 at the first request.
		err = b.store.Check(ctx)
	}
	if err == nil {
		err = migrate(ctx, b.db, o.db)
	}
	if err != nil {
		b.close()
		return nil, err
	}
	return b, nil
}

// openSQL is the database/sql backend: sqlstore on the pool, or (-store
// gorm) GORM on the same pool with gormstore.
func openSQL(storeName, db, dsn string) (*backend, error) {
	sdb, err := openDB(db, dsn)
	if err != nil {
		return nil, err
	}
	b := &backend{db: sdb, provider: fakepay.New(sdb, db), close: func() { sdb.Close() }}
	if storeName == "sql" {
		dialect := map[string]sqlstore.Dialect{"sqlite": sqlstore.SQLite, "postgres": sqlstore.Postgres, "mysql": sqlstore.MySQL}[db]
		b.store, err = sqlstore.New(sdb, dialect)
		b.repo, b.rig = &sqlRepo{db: sdb, dialect: db}, benchrig.SQL(sdb, db)
	} else {
		d := map[string]gorm.Dialector{"sqlite": &sqlite.Dialector{Conn: sdb}, "postgres": postgres.New(postgres.Config{Conn: sdb}),
			// GORM on MariaDB adds RETURNING to inserts; the plain MySQL
			// dialect keeps inserts portable to MySQL 8.
			"mysql": mysql.New(mysql.Config{Conn: sdb, DisableWithReturning: true})}[db]
		var gdb *gorm.DB
		gdb, err = gorm.Open(d, &gorm.Config{Logger: logger.Discard})
		if err == nil {
			err = gdb.Use(gormstore.Plugin()) // gormRepo's statements join the request's transaction
		}
		if err == nil {
			b.store, err = gormstore.New(gdb)
			b.repo, b.rig = &gormRepo{db: gdb}, benchrig.GORM(gdb, db)
		}
	}
	if err != nil {
		sdb.Close()
		return nil, err
	}
	return b, nil
}

// openDB opens the database/sql pool, with the DSN settings the stores
// rely on.
func openDB(db, dsn string) (*sql.DB, error) {
	var sdb *sql.DB
	var err error
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
		sdb, err = sql.Open("sqlite", dsn)
	case "postgres":
		if dsn == "" {
			return nil, errors.New("-db postgres needs -dsn (postgres://user@host:port/db)")
		}
		sdb, err = sql.Open("pgx", dsn)
	case "mysql":
		cfg, perr := mysqldriver.ParseDSN(dsn)
		if dsn == "" {
			perr = errors.New("none given")
		}
		if perr != nil {
			return nil, fmt.Errorf("-db mysql needs -dsn (user:pass@tcp(host:port)/db): %w", perr)
		}
		// Times scanned as time.Time (in UTC unless the DSN says loc=), and
		// unless the DSN says otherwise one round trip per statement instead
		// of prepare, execute and close (sqlstore's README, "Connection settings").
		cfg.ParseTime = true
		cfg.InterpolateParams = cfg.InterpolateParams || !strings.Contains(dsn, "interpolateParams=")
		sdb, err = sql.Open("mysql", cfg.FormatDSN())
	default:
		return nil, fmt.Errorf("-db %q: want sqlite, postgres or mysql", db)
	}
	if err != nil {
		return nil, err
	}
	sdb.SetMaxOpenConns(maxConns)
	sdb.SetMaxIdleConns(maxConns)
	return sdb, nil
}

// openPGX is the pgx backend: a pgxpool of maxConns connections, pgxstore
// on it, and the business repo and the provider on the same pool.
func openPGX(ctx context.Context, db, dsn string) (*backend, error) {
	if db != "postgres" || dsn == "" {
		return nil, errors.New("-store pgx needs -db postgres and -dsn (postgres://user@host:port/db)")
	}
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, err
	}
	cfg.MaxConns, cfg.MinConns = maxConns, maxConns
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
	return &backend{store: st, repo: pgxRepo{&sqlRepo{db: sdb, dialect: db}}, db: sdb, provider: fakepay.New(sdb, db),
		rig: benchrig.PGX(pool), close: pool.Close}, nil
}

// maxConns bounds the service's database connections, all kept open when
// idle: database/sql keeps 2 by default, so under load every request beyond
// the second would open a connection (on Postgres, a server process).
const maxConns = 16
