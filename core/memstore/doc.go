// Package memstore is an in-memory [store.Store] for tests and
// single-process development.
//
// Records live in a map behind one mutex, and a stored record is never
// changed in place: every write stores a new version. Byte slices are
// copied on the way in and on the way out: a caller can never alias stored
// data. Records are
// lost when the process exits, and nothing is shared between processes, so
// memstore gives no protection against duplicates across several replicas
// of a service; use a database store there.
//
// # Leased mode
//
// [New] returns a [Store], which implements [store.Store]: every claim is
// visible at once and the engine protects the attempt with a lease and a
// fencing token.
//
// # Atomic mode
//
// [Store.Atomic] returns an [AtomicStore] over the same records, which also
// implements [store.TxStore], so the engine's atomic mode can be tested
// without a database. It emulates what a SQL store does inside a database
// transaction:
//
//   - writes made with a context returned by [AtomicStore.Begin] are part of
//     that transaction; the transaction sees its own writes;
//   - outside the transaction the records it wrote keep their committed
//     value (Get sees the committed value; an uncommitted claim is invisible),
//     and a Claim of an identity it holds answers at once with a record
//     carrying only ID and [store.StateInProgress], as the lock probe of a SQL
//     store does;
//   - Rollback restores every record the transaction wrote to its committed
//     value (a claim rolled back leaves the identity absent, even after
//     Complete in the same transaction); Commit publishes them;
//   - as with database/sql, the transaction is rolled back when the context
//     given to Begin is cancelled before Commit.
//
// Unlike a database, memstore never blocks: Extend, Complete and Release of
// a record held by another open transaction fail with [core.ErrFenced] at
// once (only the holder knows the token, and it uses its own context), and
// DeleteExpired skips such records.
//
// # Time
//
// Like every store, memstore never reads a clock: Claim, Get and
// DeleteExpired decide expiry with the time they are given. Extend, Complete
// and Release are not given a time, so they decide by state and fencing
// token alone: the holder of an expired record that nobody has claimed or
// swept since can still complete, extend or release it (a record that was
// claimed again has a new token, and a swept one is absent, so the holder is
// fenced in both cases).
//
// # Contexts
//
// Every method returns an error wrapping both [core.ErrStoreUnavailable]
// and the context's error when called with a context that is already done.
package memstore
