package pgxstore

import (
	"context"

	"github.com/idemkit/idem/core/store"
	"github.com/idemkit/idem/internal/inflight"
)

// The registry of in-flight ids, as sqlstore's (registry.go there): the
// store remembers the ids that its own open transactions (begun by Begin)
// have claimed, and a claim of such an id answers "in progress" before it
// reaches the database, without a connection or a round trip. Begin sends
// nothing, so a transaction takes its connection only at its claim, after
// the registry. Claims of one id that arrive together queue here (while
// the first one's claim statement runs), not on the database. It is an
// optimisation of latency only: without it (another process, another
// Store value, a caller-managed transaction) the advisory lock probe
// answers.
//
// The registry never answers "in progress" for an id whose row is not held
// by an open transaction: an id enters it only after its claim statement
// succeeded, and leaves it before its transaction commits or rolls back (or
// when the context the transaction is bound to ends). A claim that waited
// inflight.ClaimWait for another claim statement of its id reads the
// committed row (Store.peek) and answers in progress only when that row is
// not final.

// registry is the store's registry of in-flight ids, keyed by its own
// transactions (internal/inflight, shared with sqlstore).
type registry = inflight.Registry[*lazyTx]

// hold records that the transaction's claim of id succeeded, unless the
// transaction has ended meanwhile; it reports whether id is now held.
func (l *lazyTx) hold(id store.ID) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.forgotten {
		return false
	}
	if l.stop == nil {
		// The database rolls the transaction back when its context ends;
		// its ids leave the registry then, even if nobody calls Rollback.
		l.stop = context.AfterFunc(l.ctx, l.forget)
	}
	l.ids = append(l.ids, id)
	return true
}

// forget takes the transaction's ids out of the registry for good. It runs
// before COMMIT and ROLLBACK: while they run, a duplicate goes to the
// database, which makes it wait for the write lock and then answer from
// the outcome.
func (l *lazyTx) forget() {
	l.mu.Lock()
	ids := l.ids
	l.ids, l.forgotten = nil, true
	l.mu.Unlock()
	l.s.reg.Forget(l, ids)
}
