package sqlstore_test

import (
	"testing"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/storetest"
	"github.com/idemkit/idem/sqlstore"
)

// conformanceOptions is what each database declares to the conformance
// suite. SQLite has one writer at a time: while a transaction holds a
// claim, a claim of another id waits for it (SerialWriters). Duplicates of
// the held id answer in progress at once through the store's registry;
// TestAtomic checks that strictly, and that another store on the same file
// (another process) waits and then replays.
func conformanceOptions(d sqlstore.Dialect) []storetest.Option {
	if d == sqlstore.SQLite {
		return []storetest.Option{storetest.SerialWriters()}
	}
	return nil
}

func TestConformance(t *testing.T) {
	for _, d := range dialects {
		t.Run(d.String(), func(t *testing.T) {
			storetest.Run(t, func(t *testing.T) core.Store {
				s, _, _ := newStore(t, d)
				return s
			}, conformanceOptions(d)...)
		})
	}
}

// BenchmarkStore runs core/storetest's benchmarks of the hot paths on each
// database (leased mode, autocommit): go test -run - -bench . ./
func BenchmarkStore(b *testing.B) {
	for _, d := range dialects {
		b.Run(d.String(), func(b *testing.B) {
			storetest.Bench(b, func(b *testing.B) core.Store {
				s, _, _ := newStore(b, d)
				return s
			})
		})
	}
}
