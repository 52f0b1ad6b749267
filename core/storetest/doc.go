// Package storetest is the conformance suite of [store.Store]: every store
// runs it, so a rule added here reaches every store at once.
//
// A store's own tests call [Run] with a factory that returns a fresh, empty
// store for each case:
//
//	func TestConformance(t *testing.T) {
//		storetest.Run(t, func(t *testing.T) store.Store {
//			return memstore.New() // your store here: a new, empty one per case
//		})
//	}
//
// (This function is compiled and run in doc_test.go, which also checks that
// it is the one shown here.) A store on a database returns a store on an
// empty table of its own per case, dropped in t.Cleanup: sqlstore's
// conformance_test.go does that for Postgres, MySQL/MariaDB and SQLite.
//
// Every case runs as a subtest named after the behaviour it checks and
// carries a sentence stating the rule; a failing case prints it. The cases
// run one after another (never in parallel), each with its own store, so a
// factory may hand out stores that share one database as long as each is
// empty when returned. Cases that need the store to be empty (the
// DeleteExpired ones count what they delete, the List ones what they
// list) rely on that.
//
// The cases that check atomic mode run only when the store also implements
// [store.TxStore]; for other stores they are skipped with a message saying
// so, which is a capability check, not a missing dependency. Likewise the
// cases of listing (List...) run only for stores that implement
// [store.Inspector]; a store that does should say so at compile time
// (var _ store.Inspector = (*Store)(nil)), so that it cannot lose the
// method and skip them unnoticed.
//
// Time is injected: the suite passes explicit times, starting at 2026-01-01
// 00:00:00 UTC, and never sleeps. Every time it passes is a whole number of
// milliseconds, so stores that keep milliseconds or microseconds
// (MySQL DATETIME(3) or (6), Postgres timestamptz) must give them back
// exactly. Times read back are compared as instants, to within a
// millisecond, so the location a store returns them in does not matter; the
// zero time (no lease) must come back as the zero time. Wall-clock time is
// used only for failsafe timeouts, so that a store that blocks fails a case
// instead of hanging the run.
//
// A store on a database that admits one writer at a time (SQLite) passes
// [SerialWriters] to Run: while a transaction holds a claim, other claims
// may then wait for it to end instead of answering at once, and the atomic
// cases check the answer they get afterwards (the committed record, or a
// new claim after a rollback) instead of failing on the wait.
//
// The package's own tests run the suite against stores broken on purpose
// (no fencing, a non-atomic claim, second precision, ...) and check that
// the cases guarding those rules fail.
//
// [Bench] measures the hot paths (claim and complete of a new identity,
// claim of an existing one, get), serially and in parallel.
//
// The package depends on the standard library and core only.
package storetest
