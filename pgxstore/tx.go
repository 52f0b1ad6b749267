package pgxstore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/store"
	"github.com/idemkit/idem/internal/storeutil"
)

type ctxKey struct{}

// callerTx is the application's own transaction (WithTx).
type callerTx struct{ tx pgx.Tx }

// hiddenTx marks a context whose transaction WithoutTx hid.
type hiddenTx struct{}

var (
	errTxDone   = errors.New("pgxstore: the transaction has ended")
	errTxFailed = errors.New("pgxstore: the transaction is aborted (a statement in it failed)")
)

// WithTx returns a context carrying the application's own transaction
// (caller-managed atomic mode), begun with pool.Begin, pool.BeginTx or
// pgx.BeginFunc: store methods called with it run in tx, and the engine
// sees InTx and never commits or rolls back. The caller commits tx after
// Complete.
func WithTx(ctx context.Context, tx pgx.Tx) context.Context {
	if tx == nil {
		return ctx
	}
	return context.WithValue(ctx, ctxKey{}, callerTx{tx})
}

// Tx returns the pgx.Tx of the transaction ctx carries (Begin, WithTx). In
// middleware-managed atomic mode handlers call it with the request's
// context (r.Context(), c.Request.Context(), c.Request().Context()) and
// run their business writes on it; sqlc users pass it to
// queries.WithTx(tx). The transaction is idem's: it commits after the
// handler, with the recorded response, so the handler neither commits nor
// rolls it back (answer a 5xx, or release, to roll it back); its Commit and
// Rollback fail with an error wrapping core.ErrConfig, and its Begin
// starts a savepoint as pgx's does. In a Leased route it is the attempt's
// own transaction, which commits with the attempt's completion
// (docs/contract.md, section 5).
//
// When ctx carries no transaction, Tx returns an error wrapping
// core.ErrNoTx that names the fix: a framework's context was passed
// instead of the request's, or the code does not run in a protected
// request.
func Tx(ctx context.Context) (pgx.Tx, error) {
	switch v := ctx.Value(ctxKey{}).(type) {
	case *lazyTx:
		if _, err := v.connection(); err != nil {
			return nil, unavailable("begin", err)
		}
		return &handlerTx{l: v}, nil
	case callerTx:
		return v.tx, nil
	}
	if info, ok := core.AttemptFrom(ctx); ok && !info.Atomic {
		return nil, fmt.Errorf("%w: pgxstore.Tx: this Leased attempt has no transaction of its own (it could not begin one: see the log); use your own *pgxpool.Pool", core.ErrNoTx)
	}
	return nil, fmt.Errorf("%w: pgxstore.Tx needs the request's context of a route in atomic mode: c.Request.Context() (Gin), c.Request().Context() (Echo), r.Context() (net/http, chi); "+
		"code that holds its own transaction passes it with pgxstore.WithTx", core.ErrNoTx)
}

// TxFrom returns the pgx.Tx that ctx carries, or nil: for code that runs
// both inside and outside atomic mode and falls back to the pool itself.
// Handlers of atomic routes call Tx, which fails loudly instead.
func TxFrom(ctx context.Context) pgx.Tx {
	tx, _ := Tx(ctx)
	return tx
}

// WithoutTx implements store.TxStore: store methods called with the result
// run on the pool, in autocommit, and InTx reports false.
func (s *Store) WithoutTx(ctx context.Context) context.Context {
	if ctx.Value(ctxKey{}) == nil {
		return ctx
	}
	return context.WithValue(ctx, ctxKey{}, hiddenTx{})
}

// InTx reports whether ctx carries a transaction (Begin, WithTx).
func (s *Store) InTx(ctx context.Context) bool {
	switch ctx.Value(ctxKey{}).(type) {
	case nil, hiddenTx:
		return false
	}
	return true
}

// Begin implements store.TxStore. It sends nothing: BEGIN travels with the
// transaction's first statement, normally the claim (one round trip for
// both), after the store's registry of in-flight ids had its say, so a
// duplicate of a request this process is running takes no connection. The
// completion travels with COMMIT. The handler reaches the transaction with
// Tx.
func (s *Store) Begin(ctx context.Context) (context.Context, store.Tx, error) {
	l := &lazyTx{s: s, ctx: ctx}
	return context.WithValue(ctx, ctxKey{}, l), l, nil
}

// conn returns what statements run on for ctx: the transaction it carries
// (begun now if it has not begun), or the pool (autocommit).
func (s *Store) conn(ctx context.Context) (c querier, inTx bool, err error) {
	switch v := ctx.Value(ctxKey{}).(type) {
	case *lazyTx:
		c, err := v.connection()
		if err != nil {
			return nil, true, unavailable("begin", err)
		}
		return c, true, nil
	case callerTx:
		return v.tx, true, nil
	}
	return s.pool, false, nil
}

// lazyTx is the store.Tx that Begin returns.
type lazyTx struct {
	s   *Store
	ctx context.Context

	mu        sync.Mutex
	conn      *pgxpool.Conn // after BEGIN
	err       error         // BEGIN failed
	closed    bool
	tokens    map[store.ID]int64 // ids this transaction claimed
	pending   []any              // the completion's arguments, sent with COMMIT
	savepoint int                // names the handler's savepoints
	used      bool               // a statement besides the first claim ran
	locked    bool               // a claim took the id's lock and did not claim
	// registry
	forgotten bool
	ids       []store.ID
	stop      func() bool
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

// beginWith sends stmts, a claim's, as the transaction's first, in one
// round trip with BEGIN, and reads their results with read; when the
// transaction has begun, it sends them alone. A claim's statements do
// not mark the transaction used.
func (l *lazyTx) beginWith(ctx context.Context, stmts []stmt, read func(pgx.BatchResults) (bool, error)) (bool, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case l.closed:
		return false, errTxDone
	case l.err != nil:
		return false, l.err
	case l.conn != nil:
		if err := l.flush(ctx); err != nil {
			return false, err
		}
		return sendBatch(ctx, l.conn, false, stmts, read)
	}
	// BEGIN and stmts go to a connection of the pool in one round trip.
	// When that connection turns out to be lost (the pool handed out an
	// idle one that the server or the network had closed: after a restart
	// or a failover, every idle one), the batch goes again to another
	// (Store.retry), whether or not it reached the server: a transaction
	// that has not committed commits nothing, and the server rolls back
	// the one of a lost connection (a server that has not yet noticed the
	// loss holds its locks until it does: the new claim then answers in
	// progress). Any other failure is the transaction's: BEGIN's ends it,
	// a statement's leaves it begun and aborted.
	for try := 1; ; try++ {
		conn, err := l.s.acquire(l.ctx)
		if err != nil {
			l.err = err
			return false, err
		}
		found, err := sendBatch(ctx, conn, true, stmts, read)
		var be errBegin
		begun := !errors.As(err, &be)
		if l.s.retry(ctx, l.ctx, ifLost, lost(conn.Conn(), err), err, try) {
			conn.Release() // closed, or in a transaction: the pool destroys it
			continue
		}
		if !begun {
			conn.Release()
			l.err = be.err
			return false, be.err
		}
		l.conn = conn
		return found, err
	}
}

// connection begins the transaction if it has not begun, sends a pending
// completion, and returns the transaction's connection.
func (l *lazyTx) connection() (*pgx.Conn, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case l.closed:
		return nil, errTxDone
	case l.err != nil:
		return nil, l.err
	case l.conn == nil:
		// BEGIN alone commits nothing: it goes again to another
		// connection while its own turns out to be lost (beginWith).
		for try := 1; ; try++ {
			conn, err := l.s.acquire(l.ctx)
			if err != nil {
				l.err = err
				return nil, err
			}
			if _, err = conn.Exec(l.ctx, "BEGIN"); err == nil {
				l.conn = conn
				break
			}
			gone := lost(conn.Conn(), err)
			conn.Release()
			if !l.s.retry(l.ctx, l.ctx, ifLost, gone, err, try) {
				l.err = err
				return nil, err
			}
		}
	}
	if err := l.flush(l.ctx); err != nil {
		return nil, err
	}
	l.used = true
	return l.conn.Conn(), nil
}

// flush sends a pending completion (l.mu held): a statement of the
// transaction after Complete must see the completed record.
func (l *lazyTx) flush(ctx context.Context) error {
	if l.pending == nil {
		return nil
	}
	args := l.pending
	l.pending = nil
	tag, err := l.conn.Exec(ctx, l.s.q.Complete, args...)
	if err != nil {
		return err
	}
	if tag.RowsAffected() == 0 {
		return core.ErrFenced
	}
	return nil
}

// claimed records that the transaction's claim of id with token succeeded.
func (l *lazyTx) claimed(id store.ID, token int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.tokens == nil {
		l.tokens = make(map[store.ID]int64, 1)
	}
	l.tokens[id] = token
}

// lockHeld records that a claim took the id's advisory lock without
// claiming: the transaction must end before its answer counts (Rollback
// waits for the ROLLBACK).
func (l *lazyTx) lockHeld() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.locked = true
}

// unclaimed forgets a claim (Release in the transaction).
func (l *lazyTx) unclaimed(id store.ID) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.tokens, id)
}

// deferCompletion keeps the completion (args of Statements.Complete) for
// COMMIT when the transaction claimed id with token itself: its row is
// then held by the transaction and cannot be fenced. It reports false when
// the completion must run now. A transaction that a failed statement
// aborted gets errTxFailed (core.ErrTxAborted).
func (l *lazyTx) deferCompletion(id store.ID, token int64, args []any) (bool, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed || l.conn == nil {
		return false, nil
	}
	if tok, ok := l.tokens[id]; !ok || tok != token {
		return false, nil
	}
	if err := l.flush(l.ctx); err != nil {
		return false, err
	}
	switch l.conn.Conn().PgConn().TxStatus() {
	case 'T':
	case 'E':
		return false, errTxFailed
	default:
		return false, nil // busy (rows left open) or not in a transaction: let the statement say why
	}
	l.pending = args
	return true, nil
}

// end forgets the transaction's ids, then commits or rolls back, and
// gives the connection back to the pool.
func (l *lazyTx) end(commit bool) error {
	l.forget()
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return errTxDone
	}
	l.closed = true
	if l.stop != nil {
		l.stop()
	}
	if l.conn == nil {
		if commit && l.err != nil {
			return l.err
		}
		return nil // never begun: nothing to end
	}
	conn := l.conn
	l.conn = nil
	if !commit {
		l.pending = nil
		if !l.used && len(l.tokens) == 0 && !l.locked {
			// Nothing but a claim that did not claim ran (a replay, an
			// in-flight duplicate), and it took no lock (a claim that
			// sees a live row answers from it without the lock): the
			// transaction holds nothing another claim could meet, so it
			// ends off the request's path, and the claim was the
			// request's only round trip.
			l.conn = nil
			l.s.background(func() {
				defer conn.Release()
				_ = rollback(l.ctx, conn)
			})
			return nil
		}
		defer conn.Release()
		return rollback(l.ctx, conn)
	}
	defer conn.Release() // a connection left in a transaction is closed, not pooled
	err := l.commit(conn)
	if err != nil && conn.Conn().PgConn().TxStatus() != 'I' {
		_ = rollback(l.ctx, conn)
	}
	return err
}

func rollback(ctx context.Context, conn *pgxpool.Conn) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), storeutil.RollbackTimeout)
	defer cancel()
	_, err := conn.Exec(ctx, "ROLLBACK")
	return err
}

// commit sends COMMIT, with the pending completion in the same round trip.
func (l *lazyTx) commit(conn *pgxpool.Conn) error {
	if l.pending == nil {
		tag, err := conn.Exec(l.ctx, "COMMIT")
		return commitResult(tag, err)
	}
	b := &pgx.Batch{}
	b.Queue(l.s.commitComplete, l.pending...)
	b.Queue("COMMIT")
	l.pending = nil
	br := conn.SendBatch(l.ctx, b)
	var one int
	cerr := br.QueryRow().Scan(&one)
	tag, err := br.Exec()
	if closeErr := br.Close(); err == nil {
		err = closeErr
	}
	if cerr != nil {
		var pe *pgconn.PgError
		if errors.As(cerr, &pe) && pe.Code == "22012" { // the completion matched no row
			return fmt.Errorf("%w: pgxstore: the completion matched no record at COMMIT; rolled back", core.ErrFenced)
		}
		return unavailable("complete", cerr)
	}
	return commitResult(tag, err)
}

func commitResult(tag pgconn.CommandTag, err error) error {
	if err != nil {
		return unavailable("commit", err)
	}
	if tag.String() == "ROLLBACK" {
		return fmt.Errorf("%w: pgxstore: COMMIT rolled the transaction back (a statement in it had failed)", core.ErrTxAborted)
	}
	return nil
}

// Commit implements store.Tx.
func (l *lazyTx) Commit() error { return l.end(true) }

// Rollback implements store.Tx.
func (l *lazyTx) Rollback() error { return l.end(false) }

// --- the handler's pgx.Tx ----------------------------------------------------

// handlerTx is the pgx.Tx that Tx hands to a handler: statements run on the
// transaction's connection; Commit and Rollback belong to idem.
type handlerTx struct{ l *lazyTx }

var _ pgx.Tx = (*handlerTx)(nil)

func misuse(call string) error {
	return fmt.Errorf("%w: pgxstore: %s on the transaction of a protected request: idem commits it with the recorded response; "+
		"to roll it back, answer with a 5xx (or release), or use tx.Begin for a savepoint", core.ErrConfig, call)
}

// Begin starts a savepoint (a pseudo nested transaction, as pgx's).
func (h *handlerTx) Begin(ctx context.Context) (pgx.Tx, error) {
	c, err := h.l.connection()
	if err != nil {
		return nil, err
	}
	h.l.mu.Lock()
	h.l.savepoint++
	name := "idem_sp_" + strconv.Itoa(h.l.savepoint)
	h.l.mu.Unlock()
	if _, err := c.Exec(ctx, "SAVEPOINT "+name); err != nil {
		return nil, err
	}
	return &savepointTx{handlerTx: h, name: name}, nil
}

// Commit fails: idem commits the transaction (see Tx).
func (h *handlerTx) Commit(context.Context) error { return misuse("Commit") }

// Rollback fails: idem rolls the transaction back (see Tx).
func (h *handlerTx) Rollback(context.Context) error { return misuse("Rollback") }

func (h *handlerTx) CopyFrom(ctx context.Context, table pgx.Identifier, cols []string, src pgx.CopyFromSource) (int64, error) {
	c, err := h.l.connection()
	if err != nil {
		return 0, err
	}
	return c.CopyFrom(ctx, table, cols, src)
}

func (h *handlerTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	c, err := h.l.connection()
	if err != nil {
		return errBatch{err}
	}
	return c.SendBatch(ctx, b)
}

// LargeObjects is not supported on idem's transaction: pgx builds
// pgx.LargeObjects only from its own transactions. It panics with a
// message naming the alternative.
func (h *handlerTx) LargeObjects() pgx.LargeObjects {
	panic("pgxstore: LargeObjects is not supported on the transaction of a protected request; run the lo_* functions with tx.Exec/tx.QueryRow")
}

func (h *handlerTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	c, err := h.l.connection()
	if err != nil {
		return nil, err
	}
	return c.Prepare(ctx, name, sql)
}

func (h *handlerTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	c, err := h.l.connection()
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	return c.Exec(ctx, sql, args...)
}

func (h *handlerTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	c, err := h.l.connection()
	if err != nil {
		return nil, err
	}
	return c.Query(ctx, sql, args...)
}

func (h *handlerTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	c, err := h.l.connection()
	if err != nil {
		return errRow{err}
	}
	return c.QueryRow(ctx, sql, args...)
}

// Conn returns the transaction's connection (nil if BEGIN failed).
func (h *handlerTx) Conn() *pgx.Conn {
	c, _ := h.l.connection()
	return c
}

// savepointTx is a savepoint in the handler's transaction.
type savepointTx struct {
	*handlerTx
	name   string
	closed bool
}

func (s *savepointTx) Commit(ctx context.Context) error {
	if s.closed {
		return pgx.ErrTxClosed
	}
	s.closed = true
	_, err := s.Exec(ctx, "RELEASE SAVEPOINT "+s.name)
	return err
}

func (s *savepointTx) Rollback(ctx context.Context) error {
	if s.closed {
		return pgx.ErrTxClosed
	}
	s.closed = true
	_, err := s.Exec(ctx, "ROLLBACK TO SAVEPOINT "+s.name)
	return err
}

type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }

type errBatch struct{ err error }

func (b errBatch) Exec() (pgconn.CommandTag, error) { return pgconn.CommandTag{}, b.err }
func (b errBatch) Query() (pgx.Rows, error)         { return nil, b.err }
func (b errBatch) QueryRow() pgx.Row                { return errRow(b) }
func (b errBatch) Close() error                     { return b.err }
func (b errBatch) Tx() pgx.Tx                       { return nil }
