package dbtest_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"path/filepath"
	"testing"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"modernc.org/sqlite"

	"github.com/idemkit/idem/core/store"
	"github.com/idemkit/idem/internal/sqlmeasure"
	"github.com/idemkit/idem/sqlstore"
	"github.com/idemkit/idem/sqlstore/sqlstoretest"
)

var dialects = []sqlstore.Dialect{sqlstore.Postgres, sqlstore.MySQL, sqlstore.SQLite}

// sqliteDSN is what the README recommends.
const sqliteOpts = "?_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)&_pragma=synchronous(NORMAL)&_txlock=immediate&_pragma=foreign_keys(1)"

// openDB opens a fresh pool on the dialect's test database, counting its
// statements, and closes it at cleanup. SQLite gets a new file per call.
func openDB(t testing.TB, d sqlstore.Dialect) (*sql.DB, *sqlstoretest.Counter) {
	t.Helper()
	db, c, _ := openDBAt(t, d, "")
	return db, c
}

// openDBAt is openDB on the SQLite file path ("": a new file), which it
// returns.
func openDBAt(t testing.TB, d sqlstore.Dialect, path string) (*sql.DB, *sqlstoretest.Counter, string) {
	t.Helper()
	var (
		conn driver.Connector
		err  error
	)
	switch d {
	case sqlstore.Postgres:
		cfg, perr := pgx.ParseConfig(sqlstoretest.DSN(t, sqlstoretest.EnvPostgres))
		if perr != nil {
			t.Fatal(perr)
		}
		conn = stdlib.GetConnector(*cfg)
	case sqlstore.MySQL:
		cfg, perr := mysql.ParseDSN(sqlstoretest.DSN(t, sqlstoretest.EnvMySQL))
		if perr != nil {
			t.Fatal(perr)
		}
		conn, err = mysql.NewConnector(cfg)
	case sqlstore.SQLite:
		if path == "" {
			path = filepath.Join(t.TempDir(), "idem.db")
		}
		conn, err = sqlite.NewConnector("file:" + path + sqliteOpts)
	}
	if err != nil {
		t.Fatal(err)
	}
	c := new(sqlstoretest.Counter)
	db := sql.OpenDB(c.Connector(conn))
	// Keep the connections the races of the conformance suite open (32
	// claimers), instead of opening them again for every round.
	db.SetMaxIdleConns(40)
	t.Cleanup(func() { db.Close() })
	if err := db.PingContext(context.Background()); err != nil {
		t.Fatalf("%v: %v", d, err)
	}
	return db, c, path
}

// newStore returns a store on a fresh table (dropped at cleanup).
func newStore(t testing.TB, d sqlstore.Dialect, opts ...sqlstore.Option) (*sqlstore.Store, *sql.DB, *sqlstoretest.Counter) {
	t.Helper()
	s, db, c, _ := newStoreAt(t, d, opts...)
	return s, db, c
}

// newStoreAt is newStore that also returns a function opening another
// store on the same table through a pool of its own (another process).
func newStoreAt(t testing.TB, d sqlstore.Dialect, opts ...sqlstore.Option) (*sqlstore.Store, *sql.DB, *sqlstoretest.Counter, func(t testing.TB) *sqlstore.Store) {
	t.Helper()
	db, c, path := openDBAt(t, d, "")
	table := sqlstoretest.Table()
	s, err := sqlstore.New(db, d, append([]sqlstore.Option{sqlstore.WithTable(table)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, tb := range []string{table, table + "_marks"} {
			if _, err := db.ExecContext(context.Background(), "DROP TABLE IF EXISTS "+tb); err != nil {
				t.Errorf("drop %s: %v", tb, err)
			}
		}
	})
	twin := func(t testing.TB) *sqlstore.Store {
		db2, _, _ := openDBAt(t, d, path)
		s2, err := sqlstore.New(db2, d, append([]sqlstore.Option{sqlstore.WithTable(table)}, opts...)...)
		if err != nil {
			t.Fatal(err)
		}
		return s2
	}
	return s, db, c, twin
}

func ph(d sqlstore.Dialect) string {
	if d == sqlstore.Postgres {
		return "$1"
	}
	return "?"
}

func fixture(t *testing.T, d sqlstore.Dialect) sqlstoretest.Fixture { return fixtureWith(t, d) }

// fixtureWith is fixture for a store with opts.
func fixtureWith(t *testing.T, d sqlstore.Dialect, opts ...sqlstore.Option) sqlstoretest.Fixture {
	s, db, c, twin := newStoreAt(t, d, opts...)
	orders := s.Table() + "_orders"
	ctx := context.Background()
	if _, err := db.ExecContext(ctx, "CREATE TABLE "+orders+" (name VARCHAR(100) NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = db.ExecContext(context.Background(), "DROP TABLE IF EXISTS "+orders) })
	unique := s.Table() + "_unique"
	if _, err := db.ExecContext(ctx, "CREATE TABLE "+unique+" (name VARCHAR(100) NOT NULL PRIMARY KEY)"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = db.ExecContext(context.Background(), "DROP TABLE IF EXISTS "+unique) })
	return sqlstoretest.Fixture{
		Store: s,
		Insert: func(ctx context.Context, name string) error {
			tx, err := sqlstore.Tx(ctx) // the handler's accessor
			if err != nil {
				return err
			}
			_, err = tx.ExecContext(ctx, "INSERT INTO "+orders+" (name) VALUES ("+ph(d)+")", name)
			return err
		},
		Stream: func(ctx context.Context, prefix string, each func(string) error) error {
			tx, err := sqlstore.Tx(ctx) // the handler's accessor
			if err != nil {
				return err
			}
			rows, err := tx.QueryContext(ctx, "SELECT name FROM "+orders+" WHERE name LIKE "+ph(d)+" ORDER BY name", prefix+"%")
			if err != nil {
				return err
			}
			return sqlstoretest.EachName(rows, each)
		},
		Unique: func(ctx context.Context, name string) error {
			tx, err := sqlstore.Tx(ctx) // the handler's accessor
			if err != nil {
				return err
			}
			_, err = tx.ExecContext(ctx, "INSERT INTO "+unique+" (name) VALUES ("+ph(d)+")", name)
			return err
		},
		Count: func(t testing.TB, name string) int {
			var n int
			if err := db.QueryRowContext(context.Background(), "SELECT COUNT(*) FROM "+orders+" WHERE name = "+ph(d), name).Scan(&n); err != nil {
				t.Fatal(err)
			}
			return n
		},
		CallerManaged: func(ctx context.Context, fn func(ctx context.Context) error) error {
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				return err
			}
			if err := fn(sqlstore.WithTx(ctx, tx)); err != nil {
				_ = tx.Rollback()
				return err
			}
			return tx.Commit()
		},
		Counter: c,
		DB:      db,
		Twin:    func(t *testing.T) store.TxStore { return twin(t) },
		Exec: func(ctx context.Context, stmt string) error {
			tx, err := sqlstore.Tx(ctx)
			if err != nil {
				return err
			}
			_, err = tx.ExecContext(ctx, stmt)
			return err
		},
		QueryInt: func(ctx context.Context, query string) (n int64, err error) {
			tx, err := sqlstore.Tx(ctx)
			if err != nil {
				return 0, err
			}
			err = tx.QueryRowContext(ctx, query).Scan(&n)
			return n, err
		},
		Admin: func(t testing.TB, stmt string) {
			if _, err := db.ExecContext(context.Background(), stmt); err != nil {
				t.Fatalf("%s: %v", stmt, err)
			}
		},
		RepoTx: func(ctx context.Context, name string, commit bool) error {
			// A repository written against sqlstore.Beginner, knowing
			// nothing of idem.
			var repo sqlstore.Beginner = sqlstore.Joining(db)
			tx, err := repo.BeginTx(ctx, nil)
			if err != nil {
				return err
			}
			defer tx.Rollback()
			if _, err := tx.ExecContext(ctx, "INSERT INTO "+orders+" (name) VALUES ("+ph(d)+")", name); err != nil {
				return err
			}
			if !commit {
				return tx.Rollback()
			}
			return tx.Commit()
		},
		EndTx: func(ctx context.Context, commit bool) error {
			tx, err := sqlstore.Tx(ctx)
			if err != nil {
				return err
			}
			if commit {
				return tx.Commit()
			}
			return tx.Rollback()
		},
	}
}

// TestAtomic: the atomic-mode scenarios of sqlstoretest on every database.
func TestAtomic(t *testing.T) { sqlstoretest.PerDialect(t, dialects, fixture, sqlstoretest.RunAtomic) }

// TestExactlyOnce: the same HTTP request 50 times concurrently and 50 times
// sequentially, in middleware-managed atomic mode, on every database: one
// business row, one answer.
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
// does not starve unrelated requests (latencies logged with -v). With
// -stores.measure: more samples, and the same storms without the registry
// of in-flight ids, so every duplicate asks the database (as duplicates
// from other processes do).
func TestPool(t *testing.T) {
	sqlstoretest.PerDialect(t, dialects, fixture, sqlstoretest.RunPool)
	if sqlmeasure.Measure() {
		t.Run("without-registry", func(t *testing.T) {
			sqlstoretest.PerDialect(t, dialects, func(t *testing.T, d sqlstore.Dialect) sqlstoretest.Fixture {
				return fixtureWith(t, d, withoutRegistry())
			}, sqlstoretest.RunPool)
		})
	}
}

// TestWithin: core.Route.Within, a service that owns its database/sql
// transaction (BeginTx, sqlstore.WithTx, Commit), over HTTP on every
// database.
func TestWithin(t *testing.T) { sqlstoretest.PerDialect(t, dialects, fixture, sqlstoretest.RunWithin) }

// TestCompleter: the completers of two replicas (two pools on one table)
// and a client's retry race to settle an indeterminate payment whose
// resolver writes the payment row in its transaction: one settler, one
// row (sqlstoretest.RunCompleter).
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
