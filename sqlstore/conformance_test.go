package sqlstore_test

import (
	"strings"
	"testing"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/storetest"
	"github.com/idemkit/idem/sqlstore"
)

// sqliteSerialWriters names the conformance cases SQLite cannot pass: they
// need a claim (a write) to proceed while another transaction holds an
// uncommitted claim, and SQLite has one writer at a time. There the second
// claim waits for the first transaction (up to busy_timeout) instead; the
// README says so, and TestAtomic checks that it then replays.
var sqliteSerialWriters = []string{"/AtomicConcurrentClaim", "/AtomicUncommittedInvisible"}

// SkipSerialWriters skips t when it is one of the cases a database with a
// single writer cannot pass.
func skipSerialWriters(t *testing.T, d sqlstore.Dialect) {
	if d != sqlstore.SQLite {
		return
	}
	for _, name := range sqliteSerialWriters {
		if strings.HasSuffix(t.Name(), name) {
			t.Skip("SQLite serialises writers: a claim waits for another open write transaction (see the README)")
		}
	}
}

func TestConformance(t *testing.T) {
	for _, d := range dialects {
		t.Run(d.String(), func(t *testing.T) {
			storetest.Run(t, func(t *testing.T) core.Store {
				skipSerialWriters(t, d)
				s, _, _ := newStore(t, d)
				return s
			})
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
