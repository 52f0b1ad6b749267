package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/store"
	"github.com/idemkit/idem/internal/inflight"
	"github.com/idemkit/idem/internal/storeutil"
)

// The registry of in-flight ids. The store remembers the ids that its own
// open transactions (begun by Begin) have claimed, and a claim of such an
// id answers "in progress" before it reaches the database. For that to
// help, a transaction must not take a connection (nor, on SQLite, the write
// lock) before its claim has looked at the registry, so Begin defers BEGIN
// to the transaction's first statement (lazyTx). Then a duplicate of a
// request that this process is running costs no connection and no round
// trip: the reject policy answers at once even when the pool is busy, and
// the wait policy's polls do not compete for the pool with other requests.
// Claims of one id that arrive together queue here (while the first one's
// claim statement runs), not on the database: on MySQL/MariaDB that also
// avoids the INSERT that waits for another transaction's uncommitted row of
// the same id.
//
// SQLite, which has one writer at a time, cannot probe for another
// transaction's uncommitted claim at all: without the registry a duplicate
// waits for the first transaction to end.
//
// The registry is an optimisation of latency only. Without it (another
// process, another Store value on the same table, a caller-managed
// transaction) Postgres and MySQL probe the database, and on SQLite a
// duplicate waits for the first transaction and then answers from what it
// committed: the replay, or a claim after a rollback.
//
// The registry never answers "in progress" for an id whose row is not held
// by an open transaction: an id enters it only after its claim statement
// succeeded, and leaves it before its transaction commits or rolls back (or
// when the context the transaction is bound to ends, which rolls it back).
// A claim that waited inflight.ClaimWait for another claim statement of
// its id reads the committed row (Store.peek) and answers in progress only
// when that row is not final: that statement is claiming the id, or the
// store cannot read in time.

// registry is the store's registry of in-flight ids, keyed by its own
// transactions (internal/inflight, shared with pgxstore).
type registry = inflight.Registry[*lazyTx]

// BeginFunc begins a transaction: it returns the connection the store runs
// its statements on and the transaction that commits or rolls them back.
// See Store.BeginWith.
type BeginFunc func(ctx context.Context) (Conn, store.Tx, error)

// lazyTx is the store.Tx that Begin returns: BEGIN runs at the transaction's
// first statement (normally the claim, after the registry), with a
// context of the transaction's own that carries the values, the deadline
// and the cancellation of the context given to Begin (bind).
type lazyTx struct {
	s     *Store
	ctx   context.Context
	begin BeginFunc

	mu        sync.Mutex
	conn      Conn
	tx        store.Tx
	err       error      // BEGIN failed
	closed    bool       // Commit or Rollback was called
	forgotten bool       // its ids left the registry for good
	ids       []store.ID // held in the registry
	stop      func() bool
	// uses counts the hand-outs of the connection (one per store
	// statement, one per ConnFrom); replays those of Postgres claims that
	// answered a completed record without claiming (replayed). When every
	// use was such a claim, the transaction wrote nothing and holds
	// nothing another claim must wait for: Rollback ends it off the
	// caller's path.
	uses, replays int
	// unbind and cancel end the transaction's own context (bind).
	unbind func() bool
	cancel func()
}

// bind returns the context the transaction begins with: ctx's values
// and deadline (its own timer: a statement past it fails with
// context.DeadlineExceeded, as on ctx), and ctx's cancellation, with its
// cause, passed on (context.AfterFunc) until unbind, so that a ROLLBACK
// run off the caller's path is not cut short when the caller's context
// ends after Rollback returned (database/sql and its drivers end a
// transaction, and its connection, when the context it began with ends).
func (l *lazyTx) bind() context.Context {
	ctx, cancel := context.WithCancelCause(context.WithoutCancel(l.ctx))
	stop := func() {}
	if dl, ok := l.ctx.Deadline(); ok {
		var cancelDl context.CancelFunc
		ctx, cancelDl = context.WithDeadline(ctx, dl)
		stop = cancelDl
	}
	l.cancel = func() { stop(); cancel(nil) }
	l.unbind = context.AfterFunc(l.ctx, func() {
		if !errors.Is(l.ctx.Err(), context.DeadlineExceeded) { // the deadline is ctx's own timer's
			cancel(context.Cause(l.ctx))
		}
	})
	return ctx
}

// release ends the transaction's own context.
func (l *lazyTx) release() {
	if l.unbind != nil {
		l.unbind()
		l.cancel()
		l.unbind, l.cancel = nil, nil
	}
}

// started reports whether BEGIN has run.
func (l *lazyTx) started() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.conn != nil || l.err != nil
}

// Begun reports whether the transaction's BEGIN has run (or failed): the
// engine completes a leased attempt in it only then (see core's
// attempt.withLocalTx).
func (l *lazyTx) Begun() bool { return l.started() }

// connection begins the transaction if it has not begun, and returns its
// connection.
func (l *lazyTx) connection() (Conn, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case l.closed:
		return nil, sql.ErrTxDone
	case l.conn != nil:
		l.uses++
		return l.conn, nil
	case l.err != nil:
		return nil, l.err
	}
	if err := l.ctx.Err(); err != nil {
		l.err = err
		return nil, err
	}
	c, tx, err := l.begin(l.bind())
	if err != nil {
		l.release()
		l.err = err
		return nil, err
	}
	l.conn, l.tx = c, tx
	l.uses++
	return c, nil
}

// replayed records that the statement of the last hand-out of the
// connection was a claim that answered a completed record: it wrote
// nothing, and whatever lock it took (the advisory lock of an id whose
// row committed between its snapshot and its probe) guards a record that
// is final.
func (l *lazyTx) replayed() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.replays++
}

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

// restart rolls back a transaction whose statements so far the database
// has already rolled back (a deadlock victim's), so that the next statement
// begins a new one. It refuses (false) once the transaction has ended or
// holds a claimed id.
func (l *lazyTx) restart() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed || l.tx == nil || len(l.ids) > 0 {
		return false
	}
	_ = l.tx.Rollback()
	l.release()
	l.conn, l.tx, l.err = nil, nil, nil
	l.uses, l.replays = 0, 0
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

// end forgets the transaction's ids, then commits or rolls back.
func (l *lazyTx) end(commit bool) error {
	l.forget()
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return sql.ErrTxDone
	}
	l.closed = true
	if l.stop != nil {
		l.stop()
	}
	switch {
	case l.tx != nil && commit && l.ctx.Err() != nil:
		// As database/sql: a transaction whose context ended does not
		// commit (the context's end reaches it through bind a moment
		// later).
		_ = l.tx.Rollback()
		l.release()
		return l.ctx.Err()
	case l.tx != nil && commit:
		err := l.tx.Commit()
		l.release()
		if err != nil && isLostRace(err) {
			// Galera: another node's write to the same rows was certified
			// first; nothing of this transaction persists (ErrTxAborted
			// too, as for a statement that meets the rollback).
			return fmt.Errorf("%w: %w: sqlstore: commit: %w", core.ErrTxAborted, core.ErrLostRace, err)
		}
		return err
	case l.tx != nil && l.uses == l.replays:
		// Nothing but replays ran: the ROLLBACK runs off the caller's
		// path (a replay answers one round trip sooner), and the
		// connection goes back to the pool once it has run.
		tx, cancel := l.tx, l.cancel
		l.unbind()
		l.unbind, l.cancel = nil, nil
		go func() {
			// A ROLLBACK that hangs (a dead connection) is cut short, and
			// its connection closed, after storeutil.RollbackTimeout.
			t := time.AfterFunc(storeutil.RollbackTimeout, cancel)
			_ = tx.Rollback()
			t.Stop()
			cancel()
		}()
		return nil
	case l.tx != nil:
		defer l.release()
		return l.tx.Rollback()
	case l.err != nil && commit:
		return l.err
	}
	return nil // never begun: nothing to end
}

// Commit implements store.Tx.
func (l *lazyTx) Commit() error { return l.end(true) }

// Rollback implements store.Tx.
func (l *lazyTx) Rollback() error { return l.end(false) }
