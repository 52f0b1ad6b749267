package dbtest_test

import (
	"database/sql"
	"testing"

	"github.com/idemkit/idem/core/store"
	"github.com/idemkit/idem/core/storetest"
	"github.com/idemkit/idem/sqlstore"
	"github.com/idemkit/idem/sqlstore/internal/testhook"
)

// conformanceOptions is what each database declares to the conformance
// suite. SQLite has one writer at a time: while a transaction holds a
// claim, a claim of another id waits for it, and without the registry
// (another process) so does a duplicate (SerialWriters).
func conformanceOptions(d sqlstore.Dialect) []storetest.Option {
	if d == sqlstore.SQLite {
		return []storetest.Option{storetest.SerialWriters()}
	}
	return nil
}

// withoutRegistry is the store option that makes every claim ask the
// database, as a claim from another process does (sqlstore keeps it out
// of its API: testhook).
func withoutRegistry() sqlstore.Option { return testhook.WithoutRegistry().(sqlstore.Option) }

// TestConformance runs core/storetest on every database twice: as the
// store is (a duplicate of a request that the store's own transaction
// holds is answered by its registry of in-flight ids), and without the
// registry, so that every claim asks the database as one from another
// process does (Postgres' advisory lock, MySQL's NOWAIT probe, SQLite's
// wait for the writer).
func TestConformance(t *testing.T) {
	for _, d := range dialects {
		t.Run(d.String(), func(t *testing.T) {
			for _, v := range []struct {
				name string
				opts []sqlstore.Option
			}{
				{"registry", nil},
				{"probe", []sqlstore.Option{withoutRegistry()}},
			} {
				t.Run(v.name, func(t *testing.T) {
					storetest.Run(t, func(t *testing.T) store.Store {
						s, _, _ := newStore(t, d, v.opts...)
						return s
					}, conformanceOptions(d)...)
				})
			}
		})
	}
}

// TestConformanceIsolation runs core/storetest without the registry on
// Postgres and MySQL/MariaDB with Begin's transactions at REPEATABLE READ
// and SERIALIZABLE (TestConformance runs them at the store's default,
// READ COMMITTED on MySQL/MariaDB and Postgres's): the claim's probe, its
// INSERT and its reads must keep every rule at the stricter levels too,
// where a statement reads the transaction's snapshot. Not MySQL/MariaDB
// at SERIALIZABLE: InnoDB turns every plain read of a transaction into a
// locking read there, which waits for another transaction's uncommitted
// claim (a claim must not wait; see the README).
func TestConformanceIsolation(t *testing.T) {
	for _, d := range dialects {
		if d == sqlstore.SQLite {
			continue // SERIALIZABLE only, one writer at a time
		}
		t.Run(d.String(), func(t *testing.T) {
			levels := []sql.IsolationLevel{sql.LevelRepeatableRead, sql.LevelSerializable}
			if d == sqlstore.MySQL {
				levels = levels[:1]
			}
			for _, level := range levels {
				t.Run(level.String(), func(t *testing.T) {
					storetest.Run(t, func(t *testing.T) store.Store {
						s, _, _ := newStore(t, d, withoutRegistry(), sqlstore.WithTxOptions(&sql.TxOptions{Isolation: level}))
						return s
					}, conformanceOptions(d)...)
				})
			}
		})
	}
}

// BenchmarkStore runs core/storetest's benchmarks of the hot paths on each
// database (leased mode, autocommit): go test -run - -bench . ./
func BenchmarkStore(b *testing.B) {
	for _, d := range dialects {
		b.Run(d.String(), func(b *testing.B) {
			storetest.Bench(b, func(b *testing.B) store.Store {
				s, _, _ := newStore(b, d)
				return s
			})
		})
	}
}
