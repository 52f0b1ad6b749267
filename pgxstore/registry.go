package pgxstore

import (
	"bytes"
	"context"
	"sync"
	"time"

	"github.com/idemkit/idem/core"
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
// when the context the transaction is bound to ends).

// claimWait bounds how long a claim waits for another claim statement of
// the same id that is running in this process. A claim statement normally
// answers within milliseconds, and the claims that waited then share its
// answer (a completed record to replay, or the id held: in progress). One
// that takes longer is itself waiting, for a connection of a busy pool or
// for SQLite's write lock, and its duplicates answer in progress rather
// than queue behind it, each for a turn at the database (the contract's
// 409 within 100 ms).
const claimWait = 50 * time.Millisecond

// registry holds the ids claimed by open transactions of this store.
type registry struct {
	mu sync.Mutex
	m  map[core.ID]*claimant
}

// claimant is a transaction claiming (held false) or holding (held true)
// an id.
type claimant struct {
	tx   *lazyTx
	held bool
	done chan struct{} // closed when the claim statement has run
	// found is the completed record the claim statement found (and did
	// not claim), for the claims of the same id that waited for it: a
	// storm of retries of one completed request reads the row once.
	found   *core.Record
	waiters int // claims waiting for done (under registry.mu)
}

// enter decides what a claim of id by tx (nil: outside any transaction, or
// in a caller-managed one) does before it reaches the database:
//   - held: another open transaction of this store holds id: the claim
//     answers in progress;
//   - c != nil: tx is now id's claimant; the caller runs the claim and then
//     calls settle.
//
// Otherwise the claim goes to the database. When another transaction's
// claim statement of id is running, a claim that may wait (it holds no
// database lock: outside any transaction, or in a transaction that has not
// begun) waits for that statement, up to claimWait, and then answers in
// progress (held); one that may not (its transaction may hold the write
// lock the other claim waits for) goes to the database.
//
// A claim that waited for another claim statement which found id
// completed gets that record (found, a copy of its own) instead of asking
// the database again, when it is still live at now.
func (r *registry) enter(ctx context.Context, id core.ID, tx *lazyTx, wait bool, now time.Time) (c *claimant, held bool, found *core.Record, err error) {
	for {
		r.mu.Lock()
		cur := r.m[id]
		switch {
		case cur == nil:
			if tx != nil {
				if r.m == nil {
					r.m = make(map[core.ID]*claimant)
				}
				c = &claimant{tx: tx, done: make(chan struct{})}
				r.m[id] = c
			}
			r.mu.Unlock()
			return c, false, nil, nil
		case cur.tx == tx:
			// This transaction claimed id before: the database answers
			// with its own row.
			r.mu.Unlock()
			return nil, false, nil, nil
		case cur.held:
			r.mu.Unlock()
			return nil, true, nil, nil
		case !wait:
			r.mu.Unlock()
			return nil, false, nil, nil
		}
		cur.waiters++
		r.mu.Unlock()
		t := time.NewTimer(claimWait)
		select {
		case <-cur.done:
			t.Stop()
		case <-t.C:
			// The claim statement is itself waiting (for a connection of
			// a busy pool, for SQLite's write lock): its transaction
			// will hold id, or answer from a record this claim would
			// wait for too. In progress now, not a turn at the
			// database after it.
			return nil, true, nil, nil
		case <-ctx.Done():
			t.Stop()
			return nil, false, nil, ctx.Err()
		}
		if f := cur.found; f != nil && f.ExpiresAt.After(now) {
			return nil, false, copyRecord(f), nil
		}
	}
}

// settle ends c's claim statement of id: held records that c's transaction
// now holds id, else c leaves the registry. found is the record the
// statement returned without claiming it, if any: a completed one is
// handed to the claims that waited (it was committed, so it is what they
// would read).
func (r *registry) settle(c *claimant, id core.ID, held bool, found *core.Record) {
	r.mu.Lock()
	if r.m[id] == c { // not forgotten meanwhile (the transaction ended)
		if held {
			c.held = true
		} else {
			delete(r.m, id)
		}
	}
	waited := c.waiters > 0
	r.mu.Unlock()
	if waited && !held && found != nil && found.State == core.StateCompleted {
		// Published by close(c.done). Claims that start waiting after the
		// unlock above find c gone from the registry, or held.
		c.found = copyRecord(found)
	}
	close(c.done)
}

// copyRecord returns a copy of r that shares no memory with it.
func copyRecord(r *core.Record) *core.Record {
	c := *r
	c.Fingerprint = bytes.Clone(r.Fingerprint)
	c.Response = bytes.Clone(r.Response)
	return &c
}

// forget removes ids of tx from the registry.
func (r *registry) forget(tx *lazyTx, ids []core.ID) {
	r.mu.Lock()
	for _, id := range ids {
		if c := r.m[id]; c != nil && c.tx == tx {
			delete(r.m, id)
		}
	}
	r.mu.Unlock()
}

// hold records that the transaction's claim of id succeeded, unless the
// transaction has ended meanwhile; it reports whether id is now held.
func (l *lazyTx) hold(id core.ID) bool {
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
	l.s.reg.forget(l, ids)
}
