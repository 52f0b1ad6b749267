package memstore

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/store"
)

// AtomicStore is a view of a [Store] that implements [store.TxStore] (atomic
// mode) over the same records. Get one with [Store.Atomic]; the embedded
// Store gives the plain view back.
type AtomicStore struct {
	*Store
}

var (
	_ store.TxStore   = (*AtomicStore)(nil)
	_ store.Inspector = (*AtomicStore)(nil)
)

// ErrTxDone is returned by methods called with the context of a transaction
// that was already committed or rolled back, and by a second Commit or
// Rollback.
var ErrTxDone = errors.New("memstore: transaction has already been committed or rolled back")

// txKey is the context key of the *memTx that Begin puts in a context.
type txKey struct{}

// Begin starts a transaction and returns a context carrying it; methods of
// the Store called with that context (or one derived from it) run in the
// transaction. The transaction is rolled back if ctx is done before Commit.
// Transactions do not nest: Begin with a context that already carries a
// transaction of this Store fails.
func (a *AtomicStore) Begin(ctx context.Context) (context.Context, store.Tx, error) {
	if err := ctx.Err(); err != nil {
		return nil, nil, unavailable(err)
	}
	if a.InTx(ctx) {
		return nil, nil, errors.New("memstore: Begin: the context already carries a transaction")
	}
	tx := &memTx{s: a.Store}
	stop := context.AfterFunc(ctx, func() { _ = tx.Rollback() })
	tx.mu.Lock()
	tx.stop = stop
	tx.mu.Unlock()
	return context.WithValue(ctx, txKey{}, tx), tx, nil
}

// InTx reports whether ctx carries a transaction begun by an AtomicStore of
// the same Store, whether or not it has ended.
func (a *AtomicStore) InTx(ctx context.Context) bool {
	tx, _ := ctx.Value(txKey{}).(*memTx)
	return tx != nil && tx.s == a.Store
}

// WithoutTx returns ctx with its transaction hidden (store.TxStore).
func (a *AtomicStore) WithoutTx(ctx context.Context) context.Context {
	if ctx.Value(txKey{}) == nil {
		return ctx
	}
	return context.WithValue(ctx, txKey{}, (*memTx)(nil))
}

// txFrom returns the transaction of s carried by ctx, nil when there is
// none, or an error when ctx is done.
func (s *Store) txFrom(ctx context.Context) (*memTx, error) {
	if err := ctx.Err(); err != nil {
		return nil, unavailable(err)
	}
	tx, _ := ctx.Value(txKey{}).(*memTx)
	if tx == nil || tx.s != s {
		return nil, nil
	}
	return tx, nil
}

func unavailable(err error) error {
	return fmt.Errorf("%w: %w", core.ErrStoreUnavailable, err)
}

// memTx is a memory transaction: the journal of the IDs whose slots it
// owns. Lock order: Store.mu before memTx.mu.
type memTx struct {
	s *Store

	mu   sync.Mutex
	stop func() bool // cancels the rollback on the end of Begin's context
	ids  []store.ID  // slots owned, each once
	done bool
}

var _ store.Tx = (*memTx)(nil)

// check returns ErrTxDone if tx has ended; a nil tx (no transaction) never
// has.
func (tx *memTx) check() error {
	if tx == nil {
		return nil
	}
	tx.mu.Lock()
	defer tx.mu.Unlock()
	if tx.done {
		return ErrTxDone
	}
	return nil
}

// enlist records that tx takes ownership of the slot of id. It fails once
// tx has ended, so that every slot tx owns is in the journal that Commit or
// Rollback settles.
func (tx *memTx) enlist(id store.ID) error {
	tx.mu.Lock()
	defer tx.mu.Unlock()
	if tx.done {
		return ErrTxDone
	}
	tx.ids = append(tx.ids, id)
	return nil
}

// Commit publishes the writes of the transaction.
func (tx *memTx) Commit() error { return tx.finish(true) }

// Rollback restores every record the transaction wrote to its committed
// value.
func (tx *memTx) Rollback() error { return tx.finish(false) }

func (tx *memTx) finish(commit bool) error {
	// The store's lock is held from the check to the last slot settled, so
	// a second finish (a Rollback racing the rollback of an ended context)
	// returns ErrTxDone only once the first has settled every slot.
	tx.s.mu.Lock()
	defer tx.s.mu.Unlock()
	tx.mu.Lock()
	if tx.done {
		tx.mu.Unlock()
		return ErrTxDone
	}
	tx.done = true
	ids, stop := tx.ids, tx.stop
	tx.ids = nil
	tx.mu.Unlock()
	if stop != nil { // nil when the context ended during Begin
		stop()
	}

	for _, id := range ids {
		if sl := tx.s.m[id]; sl != nil && sl.owner == tx {
			if !commit {
				sl.rec = sl.prev
				if sl.marked {
					tx.s.restoreMark(id, sl.prevMark)
				}
			}
			sl.owner, sl.prev, sl.marked, sl.prevMark = nil, nil, false, nil
			if sl.rec == nil {
				delete(tx.s.m, id)
			}
		}
	}
	return nil
}
