package dbtest_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"path/filepath"
	"testing"

	gosqlite "github.com/glebarez/go-sqlite"
	"github.com/glebarez/sqlite"
	gomysql "github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"gorm.io/driver/mysql"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/store"
	"github.com/idemkit/idem/core/storetest"
	"github.com/idemkit/idem/gormstore"
	"github.com/idemkit/idem/sqlstore"
	"github.com/idemkit/idem/sqlstore/sqlstoretest"
)

var dialects = []sqlstore.Dialect{sqlstore.Postgres, sqlstore.MySQL, sqlstore.SQLite}

const sqliteOpts = "?_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)&_pragma=synchronous(NORMAL)&_txlock=immediate&_pragma=foreign_keys(1)"

// driverConnector adapts a driver.Driver and a DSN to driver.Connector.
type driverConnector struct {
	d   driver.Driver
	dsn string
}

func (c driverConnector) Connect(context.Context) (driver.Conn, error) { return c.d.Open(c.dsn) }
func (c driverConnector) Driver() driver.Driver                        { return c.d }

// openGorm opens GORM on a fresh, statement-counting pool on the dialect's
// test database, closed at cleanup. SQLite gets a new file per call.
func openGorm(t testing.TB, d sqlstore.Dialect) (*gorm.DB, *sqlstoretest.Counter) {
	t.Helper()
	db, c, _ := openGormAt(t, d, "")
	return db, c
}

// openGormAt is openGorm on the SQLite file path ("": a new file), which
// it returns.
func openGormAt(t testing.TB, d sqlstore.Dialect, path string) (*gorm.DB, *sqlstoretest.Counter, string) {
	t.Helper()
	c := new(sqlstoretest.Counter)
	var dialector gorm.Dialector
	switch d {
	case sqlstore.Postgres:
		cfg, err := pgx.ParseConfig(sqlstoretest.DSN(t, sqlstoretest.EnvPostgres))
		if err != nil {
			t.Fatal(err)
		}
		dialector = postgres.New(postgres.Config{Conn: sql.OpenDB(c.Connector(stdlib.GetConnector(*cfg)))})
	case sqlstore.MySQL:
		cfg, err := gomysql.ParseDSN(sqlstoretest.DSN(t, sqlstoretest.EnvMySQL))
		if err != nil {
			t.Fatal(err)
		}
		conn, err := gomysql.NewConnector(cfg)
		if err != nil {
			t.Fatal(err)
		}
		// DisableWithReturning: GORM would add RETURNING to inserts on
		// MariaDB (see the README); the store itself never uses GORM's
		// statement builder.
		dialector = mysql.New(mysql.Config{Conn: sql.OpenDB(c.Connector(conn)), DisableWithReturning: true})
	case sqlstore.SQLite:
		if path == "" {
			path = filepath.Join(t.TempDir(), "idem.db")
		}
		dsn := "file:" + path + sqliteOpts
		dialector = sqlite.Dialector{Conn: sql.OpenDB(c.Connector(driverConnector{&gosqlite.Driver{}, dsn}))}
	}
	db, err := gorm.Open(dialector, &gorm.Config{Logger: logger.Discard})
	if err != nil {
		t.Fatalf("%v: %v", d, err)
	}
	sqlDB, err := db.DB()
	if err != nil {
		t.Fatal(err)
	}
	// Keep the connections the races of the conformance suite open (32
	// claimers), instead of opening them again for every round.
	sqlDB.SetMaxIdleConns(40)
	t.Cleanup(func() { sqlDB.Close() })
	return db, c, path
}

// newStore returns a store on a fresh table (dropped at cleanup).
func newStore(t testing.TB, d sqlstore.Dialect) (*gormstore.Store, *gorm.DB, *sqlstoretest.Counter) {
	return newStoreOn(t, d, nil)
}

// newStoreOn is newStore on the *gorm.DB that session returns (nil: as
// opened).
func newStoreOn(t testing.TB, d sqlstore.Dialect, session func(*gorm.DB) *gorm.DB) (*gormstore.Store, *gorm.DB, *sqlstoretest.Counter) {
	s, db, c, _ := newStoreTwin(t, d, session)
	return s, db, c
}

// newStoreTwin is newStoreOn that also returns a function opening another
// store on the same table through a pool of its own (another process).
func newStoreTwin(t testing.TB, d sqlstore.Dialect, session func(*gorm.DB) *gorm.DB) (*gormstore.Store, *gorm.DB, *sqlstoretest.Counter, func(t testing.TB) *gormstore.Store) {
	t.Helper()
	db, c, path := openGormAt(t, d, "")
	if session != nil {
		db = session(db)
	}
	table := sqlstoretest.Table()
	s, err := gormstore.New(db, gormstore.WithTable(table))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, tb := range []string{table, table + "_marks"} {
			if err := db.Exec("DROP TABLE IF EXISTS " + tb).Error; err != nil {
				t.Errorf("drop %s: %v", tb, err)
			}
		}
	})
	twin := func(t testing.TB) *gormstore.Store {
		db2, _, _ := openGormAt(t, d, path)
		if session != nil {
			db2 = session(db2)
		}
		s2, err := gormstore.New(db2, gormstore.WithTable(table))
		if err != nil {
			t.Fatal(err)
		}
		return s2
	}
	return s, db, c, twin
}

// errRepoRollback is a repository transaction's own failure: GORM rolls it
// back (Fixture.RepoTx with commit false).
var errRepoRollback = errors.New("the repository rolls its transaction back")

// order is the business row of the atomic-mode tests.
type order struct {
	ID   uint   `gorm:"primaryKey"`
	Name string `gorm:"size:100;not null"`
}

// uniqueRow is a row of a table whose names are unique (Fixture.Unique).
type uniqueRow struct {
	Name string `gorm:"primaryKey;size:100"`
}

func fixture(t *testing.T, d sqlstore.Dialect) sqlstoretest.Fixture { return fixtureOn(t, d, nil) }

func fixtureOn(t *testing.T, d sqlstore.Dialect, session func(*gorm.DB) *gorm.DB) sqlstoretest.Fixture {
	return fixtureWith(t, d, session, false)
}

// fixtureWith is fixtureOn whose business statements run, with plugin,
// through the application's *gorm.DB with the plugin installed
// (db.WithContext(ctx), as a repository writes), instead of through
// gormstore.DB(ctx).
func fixtureWith(t *testing.T, d sqlstore.Dialect, session func(*gorm.DB) *gorm.DB, plugin bool) sqlstoretest.Fixture {
	s, db, c, twin := newStoreTwin(t, d, session)
	sqlDB, err := db.DB()
	if err != nil {
		t.Fatal(err)
	}
	txDB := func(ctx context.Context) *gorm.DB { return gormstore.DB(ctx) }
	if plugin {
		if err := db.Use(gormstore.Plugin()); err != nil {
			t.Fatal(err)
		}
		txDB = func(context.Context) *gorm.DB { return db }
	}
	orders := s.Table() + "_orders"
	if err := db.Table(orders).AutoMigrate(&order{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Migrator().DropTable(orders) })
	unique := s.Table() + "_unique"
	if err := db.Table(unique).AutoMigrate(&uniqueRow{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Migrator().DropTable(unique) })
	var repoTx func(ctx context.Context, name string, commit bool) error
	if plugin {
		// A repository that knows nothing of idem opens its own GORM
		// transaction with the request's context; the plugin joins it.
		repoTx = func(ctx context.Context, name string, commit bool) error {
			err := db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
				if err := tx.Table(orders).Create(&order{Name: name}).Error; err != nil {
					return err
				}
				if !commit {
					return errRepoRollback
				}
				return nil
			})
			if !commit && errors.Is(err, errRepoRollback) {
				return nil // rolled back, as the repository meant
			}
			return err
		}
	}
	return sqlstoretest.Fixture{
		Store: s,
		Insert: func(ctx context.Context, name string) error {
			tx := txDB(ctx)
			if tx == nil {
				return errors.New("no GORM transaction in the context")
			}
			return tx.WithContext(ctx).Table(orders).Create(&order{Name: name}).Error
		},
		Stream: func(ctx context.Context, prefix string, each func(string) error) error {
			tx := txDB(ctx)
			if tx == nil {
				return errors.New("no GORM transaction in the context")
			}
			rows, err := tx.WithContext(ctx).Table(orders).Select("name").Where("name LIKE ?", prefix+"%").Order("name").Rows()
			if err != nil {
				return err
			}
			return sqlstoretest.EachName(rows, each)
		},
		Unique: func(ctx context.Context, name string) error {
			tx := txDB(ctx)
			if tx == nil {
				return errors.New("no GORM transaction in the context")
			}
			return tx.WithContext(ctx).Table(unique).Create(&uniqueRow{Name: name}).Error
		},
		Count: func(t testing.TB, name string) int {
			var n int64
			if err := db.Table(orders).Where("name = ?", name).Count(&n).Error; err != nil {
				t.Fatal(err)
			}
			return int(n)
		},
		CallerManaged: func(ctx context.Context, fn func(ctx context.Context) error) error {
			return db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
				if _, prepared := tx.Statement.ConnPool.(*gorm.PreparedStmtTX); db.PrepareStmt && !prepared {
					return fmt.Errorf("ConnPool is %T, want *gorm.PreparedStmtTX", tx.Statement.ConnPool)
				}
				return fn(gormstore.WithTx(ctx, tx))
			})
		},
		Counter: c,
		DB:      sqlDB,
		Twin:    func(t *testing.T) store.TxStore { return twin(t) },
		Exec: func(ctx context.Context, stmt string) error {
			tx := txDB(ctx)
			if tx == nil {
				return errors.New("no GORM transaction in the context")
			}
			return tx.WithContext(ctx).Exec(stmt).Error
		},
		QueryInt: func(ctx context.Context, query string) (n int64, err error) {
			tx := txDB(ctx)
			if tx == nil {
				return 0, errors.New("no GORM transaction in the context")
			}
			err = tx.WithContext(ctx).Raw(query).Row().Scan(&n)
			return n, err
		},
		Admin: func(t testing.TB, stmt string) {
			if _, err := sqlDB.ExecContext(context.Background(), stmt); err != nil {
				t.Fatalf("%s: %v", stmt, err)
			}
		},
		RepoTx: repoTx,
		EndTx: func(ctx context.Context, commit bool) error {
			tx := gormstore.DB(ctx)
			if commit {
				return tx.Commit().Error
			}
			return tx.Rollback().Error
		},
	}
}

func TestAtomic(t *testing.T) { sqlstoretest.PerDialect(t, dialects, fixture, sqlstoretest.RunAtomic) }

// TestAtomicWithPlugin: RunAtomic with the business statements on the
// application's *gorm.DB (db.WithContext(ctx)) joined by the plugin,
// instead of gormstore.DB(ctx): the same results on every database.
func TestAtomicWithPlugin(t *testing.T) {
	for _, d := range dialects {
		t.Run(d.String(), func(t *testing.T) {
			sqlstoretest.RunAtomic(t, sqlstoretest.Config{Dialect: d, New: func(t *testing.T) sqlstoretest.Fixture { return fixtureWith(t, d, nil, true) }})
		})
	}
}

// TestExactlyOnceWithPlugin: RunExactlyOnce (50 concurrent, then 50
// sequential copies of one request) with the business row written
// through the application's *gorm.DB and the plugin: one row, one answer.
func TestExactlyOnceWithPlugin(t *testing.T) {
	for _, d := range dialects {
		t.Run(d.String(), func(t *testing.T) {
			sqlstoretest.RunExactlyOnce(t, sqlstoretest.Config{Dialect: d, New: func(t *testing.T) sqlstoretest.Fixture { return fixtureWith(t, d, nil, true) }})
		})
	}
}

func TestConformance(t *testing.T) {
	for _, d := range dialects {
		t.Run(d.String(), func(t *testing.T) {
			var opts []storetest.Option
			if d == sqlstore.SQLite {
				// One writer at a time: see sqlstore's TestConformance.
				opts = append(opts, storetest.SerialWriters())
			}
			storetest.Run(t, func(t *testing.T) store.Store {
				s, _, _ := newStore(t, d)
				return s
			}, opts...)
		})
	}
}

func TestNewRejectsUnknownDialector(t *testing.T) {
	if _, err := gormstore.New(nil); !errors.Is(err, core.ErrConfig) {
		t.Fatalf("New(nil): %v, want ErrConfig", err)
	}
	db, _ := openGorm(t, sqlstore.SQLite)
	if _, err := gormstore.New(db, gormstore.WithTable("no-dashes")); !errors.Is(err, core.ErrConfig) {
		t.Fatalf("New with a bad table: %v, want ErrConfig", err)
	}
}

// With PrepareStmt, GORM wraps the pool and its transactions in prepared
// statement caches; the store must still find and join the transaction.
func TestAtomicWithPrepareStmt(t *testing.T) {
	sqlstoretest.RunAtomic(t, sqlstoretest.Config{Dialect: sqlstore.SQLite, New: func(t *testing.T) sqlstoretest.Fixture {
		return fixtureOn(t, sqlstore.SQLite, func(db *gorm.DB) *gorm.DB { return db.Session(&gorm.Session{PrepareStmt: true}) })
	}})
}

// TestExactlyOnce: the same HTTP request 50 times concurrently and 50 times
// sequentially, in middleware-managed atomic mode with the business row
// written through gormstore.DB, on every database: one business row, one
// answer.
func TestExactlyOnce(t *testing.T) {
	sqlstoretest.PerDialect(t, dialects, fixture, sqlstoretest.RunExactlyOnce)
}

// TestLifetime: a Leased() route under the application's
// transaction-per-request middleware commits its record on its own
// connection, and an atomic answer over the recording cap commits first and
// streams, on every database.
func TestLifetime(t *testing.T) {
	sqlstoretest.PerDialect(t, dialects, fixture, sqlstoretest.RunLifetime)
}

// TestPool: a storm of duplicates of one long request, with a pool of 5,
// does not starve unrelated requests (latencies logged with -v; more
// samples with -stores.measure).
func TestPool(t *testing.T) { sqlstoretest.PerDialect(t, dialects, fixture, sqlstoretest.RunPool) }

// TestWithin: core.Route.Within, a service that owns its GORM transaction
// (db.Transaction, gormstore.WithTx), over HTTP on every database.
func TestWithin(t *testing.T) { sqlstoretest.PerDialect(t, dialects, fixture, sqlstoretest.RunWithin) }

// TestCompleter: sqlstoretest.RunCompleter on gormstore.
func TestCompleter(t *testing.T) {
	for _, d := range dialects {
		t.Run(d.String(), func(t *testing.T) {
			sqlstoretest.RunCompleter(t, sqlstoretest.ClusterConfig{Dialect: d, New: func(t *testing.T) []sqlstoretest.Fixture {
				return []sqlstoretest.Fixture{fixture(t, d)}
			}})
		})
	}
}

// TestFinisher: the completers of two replicas run the recorded request
// again (core.Finish) when nothing was charged, racing a client's retry:
// one charge (sqlstoretest.RunFinisher).
func TestFinisher(t *testing.T) {
	for _, d := range dialects {
		t.Run(d.String(), func(t *testing.T) {
			sqlstoretest.RunFinisher(t, sqlstoretest.ClusterConfig{Dialect: d, New: func(t *testing.T) []sqlstoretest.Fixture {
				return []sqlstoretest.Fixture{fixture(t, d)}
			}})
		})
	}
}
