package sqlstoretest

import (
	"testing"

	"github.com/idemkit/idem/sqlstore"
)

// PerDialect runs suite (RunAtomic, RunExactlyOnce, RunLifetime, RunPool)
// once per dialect, each as a subtest named after the dialect, with fresh
// fixtures from fixture. A store's test of one suite is then one line:
//
//	func TestAtomic(t *testing.T) { sqlstoretest.PerDialect(t, dialects, fixture, sqlstoretest.RunAtomic) }
func PerDialect(t *testing.T, dialects []sqlstore.Dialect, fixture func(t *testing.T, d sqlstore.Dialect) Fixture, suite func(t *testing.T, cfg Config)) {
	t.Helper()
	for _, d := range dialects {
		t.Run(d.String(), func(t *testing.T) {
			suite(t, Config{Dialect: d, New: func(t *testing.T) Fixture { return fixture(t, d) }})
		})
	}
}
