package pgxstore_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/core/store"
	"github.com/idemkit/idem/core/storetest"
	"github.com/idemkit/idem/pgxstore"
	"github.com/idemkit/idem/sqlstore"
	"github.com/idemkit/idem/sqlstore/sqlstoretest"
)

// openPool opens a pool on the test database (IDEM_TEST_POSTGRES_DSN;
// under CI a missing database fails the test) and closes it at cleanup.
func openPool(t testing.TB, mod func(*pgxpool.Config)) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(sqlstoretest.DSN(t, sqlstoretest.EnvPostgres))
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 40 // the conformance suite's races run 32 claimers
	if mod != nil {
		mod(cfg)
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if err := pool.Ping(context.Background()); err != nil {
		t.Fatal(err)
	}
	return pool
}

// newStore returns a store on a fresh table (dropped at cleanup) and a
// function opening another store on the same table through a pool of its
// own (another process).
func newStore(t testing.TB, opts ...pgxstore.Option) (*pgxstore.Store, *pgxpool.Pool, func(t testing.TB) *pgxstore.Store) {
	t.Helper()
	return newStoreOn(t, openPool(t, nil), opts...)
}

// newStoreOn is newStore on pool.
func newStoreOn(t testing.TB, pool *pgxpool.Pool, opts ...pgxstore.Option) (*pgxstore.Store, *pgxpool.Pool, func(t testing.TB) *pgxstore.Store) {
	t.Helper()
	table := sqlstoretest.Table()
	s, err := pgxstore.New(pool, append([]pgxstore.Option{pgxstore.WithTable(table)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+table+", "+table+"_marks"); err != nil {
			t.Errorf("drop %s: %v", table, err)
		}
	})
	twin := func(t testing.TB) *pgxstore.Store {
		s2, err := pgxstore.New(openPool(t, nil), append([]pgxstore.Option{pgxstore.WithTable(table)}, opts...)...)
		if err != nil {
			t.Fatal(err)
		}
		return s2
	}
	return s, pool, twin
}

// TestConformance runs core/storetest twice: as the store is (its registry
// of in-flight ids answers duplicates its own transactions hold), and
// without the registry, so every claim asks the database as one from
// another process does.
func TestConformance(t *testing.T) {
	for _, v := range []struct {
		name string
		opts []pgxstore.Option
	}{
		{"registry", nil},
		{"probe", []pgxstore.Option{pgxstore.WithoutRegistry()}},
	} {
		t.Run(v.name, func(t *testing.T) {
			storetest.Run(t, func(t *testing.T) store.Store {
				s, _, _ := newStore(t, v.opts...)
				return s
			})
		})
	}
}

// statementHook is a pgx tracer that calls a hook with the text of every
// statement once its result has been read (sqlstoretest.Fixture's
// AfterStatement).
type statementHook struct {
	hook atomic.Pointer[func(query string)]
}

type hookQuery struct{}

func (h *statementHook) set(hook func(query string)) {
	if hook == nil {
		h.hook.Store(nil)
		return
	}
	h.hook.Store(&hook)
}

func (h *statementHook) ran(query string) {
	if f := h.hook.Load(); f != nil {
		(*f)(query)
	}
}

func (h *statementHook) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	return context.WithValue(ctx, hookQuery{}, d.SQL)
}

func (h *statementHook) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryEndData) {
	q, _ := ctx.Value(hookQuery{}).(string)
	h.ran(q)
}

func (h *statementHook) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}

func (h *statementHook) TraceBatchQuery(_ context.Context, _ *pgx.Conn, d pgx.TraceBatchQueryData) {
	h.ran(d.SQL)
}

func (h *statementHook) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

func fixture(t *testing.T, opts ...pgxstore.Option) sqlstoretest.Fixture {
	hook := new(statementHook)
	s, pool, twin := newStoreOn(t, openPool(t, func(c *pgxpool.Config) { c.ConnConfig.Tracer = hook }), opts...)
	ctx := context.Background()
	orders, unique := s.Table()+"_orders", s.Table()+"_unique"
	for _, ddl := range []string{
		"CREATE TABLE " + orders + " (name VARCHAR(100) NOT NULL)",
		"CREATE TABLE " + unique + " (name VARCHAR(100) NOT NULL PRIMARY KEY)",
	} {
		if _, err := pool.Exec(ctx, ddl); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+orders+", "+unique) })
	insert := func(table string) func(ctx context.Context, name string) error {
		return func(ctx context.Context, name string) error {
			tx := pgxstore.TxFrom(ctx)
			if tx == nil {
				return errors.New("no transaction in the context")
			}
			_, err := tx.Exec(ctx, "INSERT INTO "+table+" (name) VALUES ($1)", name)
			return err
		}
	}
	return sqlstoretest.Fixture{
		Store:  s,
		Insert: insert(orders),
		Unique: insert(unique),
		Stream: func(ctx context.Context, prefix string, each func(string) error) error {
			tx := pgxstore.TxFrom(ctx)
			if tx == nil {
				return errors.New("no transaction in the context")
			}
			rows, err := tx.Query(ctx, "SELECT name FROM "+orders+" WHERE name LIKE $1 ORDER BY name", prefix+"%")
			if err != nil {
				return err
			}
			defer rows.Close()
			for rows.Next() {
				var name string
				if err := rows.Scan(&name); err != nil {
					return err
				}
				if err := each(name); err != nil {
					return err
				}
			}
			return rows.Err()
		},
		Count: func(t testing.TB, name string) int {
			var n int
			if err := pool.QueryRow(context.Background(), "SELECT COUNT(*) FROM "+orders+" WHERE name = $1", name).Scan(&n); err != nil {
				t.Fatal(err)
			}
			return n
		},
		CallerManaged: func(ctx context.Context, fn func(ctx context.Context) error) error {
			tx, err := pool.Begin(ctx)
			if err != nil {
				return err
			}
			if err := fn(pgxstore.WithTx(ctx, tx)); err != nil {
				_ = tx.Rollback(ctx)
				return err
			}
			return tx.Commit(ctx)
		},
		Hold: func(t *testing.T) func() {
			var conns []*pgxpool.Conn
			for range pool.Stat().MaxConns() {
				c, err := pool.Acquire(ctx)
				if err != nil {
					t.Fatal(err)
				}
				conns = append(conns, c)
			}
			return func() {
				for _, c := range conns {
					c.Release()
				}
				conns = nil
			}
		},
		HoldTx: func(t *testing.T, stmt string) func() {
			tx, err := pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := tx.Exec(ctx, stmt); err != nil {
				t.Fatal(err)
			}
			var once sync.Once
			release := func() { once.Do(func() { _ = tx.Rollback(ctx) }) }
			t.Cleanup(release)
			return release
		},
		Twin:           func(t *testing.T) store.TxStore { return twin(t) },
		AfterStatement: hook.set,
		Exec: func(ctx context.Context, stmt string) error {
			tx, err := pgxstore.Tx(ctx)
			if err != nil {
				return err
			}
			_, err = tx.Exec(ctx, stmt)
			return err
		},
		QueryInt: func(ctx context.Context, query string) (n int64, err error) {
			tx, err := pgxstore.Tx(ctx)
			if err != nil {
				return 0, err
			}
			err = tx.QueryRow(ctx, query).Scan(&n)
			return n, err
		},
		Admin: func(t testing.TB, stmt string) {
			if _, err := pool.Exec(context.Background(), stmt); err != nil {
				t.Fatalf("%s: %v", stmt, err)
			}
		},
		EndTx: func(ctx context.Context, commit bool) error {
			tx, err := pgxstore.Tx(ctx)
			if err != nil {
				return err
			}
			if commit {
				return tx.Commit(ctx)
			}
			return tx.Rollback(ctx)
		},
	}
}

// TestAtomic runs sqlstoretest's atomic-mode scenarios (both ways into
// atomic mode with a business table, the in-flight probe, a failed
// statement in the shared transaction, concurrent duplicates) on pgx.
func TestAtomic(t *testing.T) {
	sqlstoretest.RunAtomic(t, sqlstoretest.Config{Dialect: sqlstore.Postgres, New: func(t *testing.T) sqlstoretest.Fixture { return fixture(t) }})
}

// TestWithin runs sqlstoretest's Route.Within scenarios (a service that
// owns its pgx transaction: exactly once, the answer after the commit, a
// failed commit, a TxFunc that runs body again) on pgx.
func TestWithin(t *testing.T) {
	sqlstoretest.RunWithin(t, sqlstoretest.Config{Dialect: sqlstore.Postgres, New: func(t *testing.T) sqlstoretest.Fixture { return fixture(t) }})
}

// TestExactlyOnce runs sqlstoretest's HTTP storms (50 concurrent and 50
// sequential requests of one key; reject, wait, nested) on pgx.
func TestExactlyOnce(t *testing.T) {
	sqlstoretest.RunExactlyOnce(t, sqlstoretest.Config{Dialect: sqlstore.Postgres, New: func(t *testing.T) sqlstoretest.Fixture { return fixture(t) }})
}

// TestLifetime runs sqlstoretest's lifetime scenarios on pgx: leased
// routes inside an application's transaction-per-request middleware (the
// record commits on its own connection), a streamed 50 MiB answer, and a
// client that goes away.
func TestLifetime(t *testing.T) {
	sqlstoretest.RunLifetime(t, sqlstoretest.Config{Dialect: sqlstore.Postgres, New: func(t *testing.T) sqlstoretest.Fixture { return fixture(t) }})
}

// BenchmarkStore runs core/storetest's benchmarks of the hot paths (leased
// mode, autocommit): go test -run - -bench . ./
func BenchmarkStore(b *testing.B) {
	storetest.Bench(b, func(b *testing.B) store.Store {
		s, _, _ := newStore(b)
		return s
	})
}

// TestCompleter: sqlstoretest.RunCompleter on pgxstore (two pools on one
// table and a client's retry settle one payment once).
func TestCompleter(t *testing.T) {
	sqlstoretest.RunCompleter(t, sqlstoretest.ClusterConfig{Dialect: sqlstore.Postgres, New: func(t *testing.T) []sqlstoretest.Fixture {
		return []sqlstoretest.Fixture{fixture(t)}
	}})
}

// TestFinisher: sqlstoretest.RunFinisher on pgxstore.
func TestFinisher(t *testing.T) {
	sqlstoretest.RunFinisher(t, sqlstoretest.ClusterConfig{Dialect: sqlstore.Postgres, New: func(t *testing.T) []sqlstoretest.Fixture {
		return []sqlstoretest.Fixture{fixture(t)}
	}})
}
