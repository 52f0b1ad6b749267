// Package inflight is the registry of in-flight ids that idem's SQL
// stores (sqlstore, pgxstore) share: each store remembers the ids its own
// open transactions have claimed, so a duplicate of a request this
// process is running answers in progress before it reaches the database.
// See sqlstore/registry.go for how a store uses it.
package inflight

import (
	"bytes"
	"context"
	"sync"
	"time"

	"github.com/idemkit/idem/core/store"
)

// ClaimWait bounds how long a claim waits for another claim statement of
// the same id that is running in this process. A claim statement normally
// answers within milliseconds, and the claims that waited then share its
// answer (a completed record to replay, or the id held: in progress). One
// that takes longer is itself waiting (for a connection of a busy pool,
// for SQLite's write lock, for a busy CPU), and its duplicates do not
// queue behind it, each for a turn at the database (the contract's 409
// within 100 ms): each reads the committed record instead (Peek), which
// waits for no lock, and answers from it when it is final, else in
// progress. Peek waits at most ClaimWait for a connection of a full pool.
const ClaimWait = 50 * time.Millisecond

// Peek reads the committed record of the id a claim asks for, without
// waiting for any lock, on a connection of its own that it waits for at
// most ClaimWait when the pool is full. It returns the record when that record answers the
// claim (live, and not one the claim may take over: completed,
// indeterminate, or in progress under a live lease), else nil.
type Peek func(ctx context.Context) (*store.Record, error)

// Registry holds the ids claimed by open transactions of one store; T
// identifies a transaction (the store's own transaction type; its zero
// value: outside any transaction, or in one the store does not track).
type Registry[T comparable] struct {
	mu sync.Mutex
	m  map[store.ID]*Claimant[T]
}

// Claimant is a transaction claiming (held false) or holding (held true)
// an id.
type Claimant[T comparable] struct {
	tx   T
	held bool
	done chan struct{} // closed when the claim statement has run
	// found is the completed record the claim statement found (and did
	// not claim), for the claims of the same id that waited for it: a
	// storm of retries of one completed request reads the row once.
	found   *store.Record
	waiters int // claims waiting for done (under registry.mu)
}

// Enter decides what a claim of id by tx (nil: outside any transaction, or
// in a caller-managed one) does before it reaches the database:
//   - held: another open transaction of this store holds id: the claim
//     answers in progress;
//   - c != nil: tx is now id's claimant; the caller runs the claim and then
//     calls Settle.
//
// Otherwise the claim goes to the database. When another transaction's
// claim statement of id is running, a claim that may wait (it holds no
// database lock: outside any transaction, or in a transaction that has not
// begun) waits for that statement, up to ClaimWait; one that may not (its
// transaction may hold the write lock the other claim waits for) goes to
// the database.
//
// A claim that waited for another claim statement which found id
// completed gets that record (found, a copy of its own) instead of asking
// the database again, when it is still live at now. One whose wait ran
// out asks peek: found when the committed record answers the claim, else
// held (in progress: the statement it waited for is claiming id, or will
// answer from a record that peek saw being replaced). Never held for a
// record that peek found final: a slow claim statement must not turn a
// replay into "in progress".
func (r *Registry[T]) Enter(ctx context.Context, id store.ID, tx T, wait bool, now time.Time, peek Peek) (c *Claimant[T], held bool, found *store.Record, err error) {
	var none T
	for {
		r.mu.Lock()
		cur := r.m[id]
		switch {
		case cur == nil:
			if tx != none {
				if r.m == nil {
					r.m = make(map[store.ID]*Claimant[T])
				}
				c = &Claimant[T]{tx: tx, done: make(chan struct{})}
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
		t := time.NewTimer(ClaimWait)
		select {
		case <-cur.done:
			t.Stop()
		case <-t.C:
			// The claim statement is itself waiting (for a connection of
			// a busy pool, for SQLite's write lock, for a CPU): not a
			// turn at the database behind it, but a look at what is
			// committed, which waits for no lock.
			return r.peeked(ctx, peek)
		case <-ctx.Done():
			t.Stop()
			return nil, false, nil, ctx.Err()
		}
		if f := cur.found; f != nil && f.ExpiresAt.After(now) {
			return nil, false, copyRecord(f), nil
		}
	}
}

// peeked answers a claim whose wait for another claim statement of the
// same id ran out: from the committed record when it is final, else in
// progress. A peek that fails (no connection within ClaimWait: the pool is
// as busy as the statement waited for) answers in progress too, the
// answer that never runs a handler twice; only the end of ctx is an error.
func (r *Registry[T]) peeked(ctx context.Context, peek Peek) (c *Claimant[T], held bool, found *store.Record, err error) {
	rec, err := peek(ctx)
	switch {
	case ctx.Err() != nil:
		return nil, false, nil, ctx.Err()
	case err == nil && rec != nil:
		return nil, false, rec, nil
	}
	return nil, true, nil, nil
}

// Settle ends c's claim statement of id: held records that c's transaction
// now holds id, else c leaves the registry. found is the record the
// statement returned without claiming it, if any: a completed one is
// handed to the claims that waited (it was committed, so it is what they
// would read).
func (r *Registry[T]) Settle(c *Claimant[T], id store.ID, held bool, found *store.Record) {
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
	if waited && !held && found != nil && found.State == store.StateCompleted {
		// Published by close(c.done). Claims that start waiting after the
		// unlock above find c gone from the registry, or held.
		c.found = copyRecord(found)
	}
	close(c.done)
}

// copyRecord returns a copy of r that shares no memory with it.
func copyRecord(r *store.Record) *store.Record {
	c := *r
	c.Fingerprint = bytes.Clone(r.Fingerprint)
	c.Response = bytes.Clone(r.Response)
	return &c
}

// Forget removes ids of tx from the registry.
func (r *Registry[T]) Forget(tx T, ids []store.ID) {
	r.mu.Lock()
	for _, id := range ids {
		if c := r.m[id]; c != nil && c.tx == tx {
			delete(r.m, id)
		}
	}
	r.mu.Unlock()
}
