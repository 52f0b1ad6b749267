package sqlstoretest

import (
	"context"
	"database/sql/driver"
	"sync"
	"sync/atomic"
)

// Counter counts the statements a database/sql pool sends to the database:
// every Exec and Query, direct or through a prepared statement. BEGIN,
// COMMIT and ROLLBACK (driver.Tx) are not counted; prepares are counted
// apart (Prepares), since some drivers prepare each parameterised statement
// (go-sql-driver/mysql without interpolateParams).
type Counter struct {
	stmts, prepares atomic.Int64
	held            atomic.Pointer[chan struct{}]      // see HoldBegins
	heldRollbacks   atomic.Pointer[chan struct{}]      // see HoldRollbacks
	rollbacks       atomic.Int64                       // ROLLBACKs that returned
	rollbackErrs    atomic.Int64                       // of them, those that failed
	after           atomic.Pointer[func(query string)] // see AfterStatement
}

// AfterStatement makes every statement on the pool call hook with its
// text once the database has answered it (its rows, if any, not yet
// read), before the statement returns to its caller; nil stops it. A test
// uses it to land a write of another connection at an exact point between
// two statements of the store.
func (c *Counter) AfterStatement(hook func(query string)) {
	if hook == nil {
		c.after.Store(nil)
		return
	}
	c.after.Store(&hook)
}

// ran calls the AfterStatement hook, if any, for query.
func (c *Counter) ran(query string) {
	if h := c.after.Load(); h != nil {
		(*h)(query)
	}
}

// HoldBegins makes every BEGIN on the pool wait until release is called
// (or its context ends): a transaction slow to start, as on a busy
// machine. Statements outside a transaction go on.
func (c *Counter) HoldBegins() (release func()) { return hold(&c.held) }

// HoldRollbacks makes every ROLLBACK on the pool wait until release is
// called, as a slow network would: a test tells a rollback on the
// request's path (the caller waits) from one off it. COMMIT goes on.
func (c *Counter) HoldRollbacks() (release func()) { return hold(&c.heldRollbacks) }

// hold puts a gate in p until release, which may be called more than once.
func hold(p *atomic.Pointer[chan struct{}]) (release func()) {
	ch := make(chan struct{})
	p.Store(&ch)
	var once sync.Once
	return func() {
		once.Do(func() {
			p.Store(nil)
			close(ch)
		})
	}
}

// Rollbacks returns the number of ROLLBACKs that have returned so far.
func (c *Counter) Rollbacks() int64 { return c.rollbacks.Load() }

// RollbackErrors returns the number of ROLLBACKs that have failed so far
// (a ROLLBACK cut short by its context's end fails, and database/sql then
// closes its connection).
func (c *Counter) RollbackErrors() int64 { return c.rollbackErrs.Load() }

// Statements returns the number of statements run so far.
func (c *Counter) Statements() int64 { return c.stmts.Load() }

// Prepares returns the number of statements prepared so far.
func (c *Counter) Prepares() int64 { return c.prepares.Load() }

// Connector wraps inner so that sql.OpenDB(c.Connector(inner)) counts.
func (c *Counter) Connector(inner driver.Connector) driver.Connector {
	return &connector{inner: inner, c: c}
}

type connector struct {
	inner driver.Connector
	c     *Counter
}

func (k *connector) Connect(ctx context.Context) (driver.Conn, error) {
	dc, err := k.inner.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return &conn{inner: dc, c: k.c}, nil
}

func (k *connector) Driver() driver.Driver { return k.inner.Driver() }

type conn struct {
	inner driver.Conn
	c     *Counter
}

var (
	_ driver.Conn               = (*conn)(nil)
	_ driver.ConnBeginTx        = (*conn)(nil)
	_ driver.ConnPrepareContext = (*conn)(nil)
	_ driver.ExecerContext      = (*conn)(nil)
	_ driver.QueryerContext     = (*conn)(nil)
	_ driver.NamedValueChecker  = (*conn)(nil)
	_ driver.SessionResetter    = (*conn)(nil)
	_ driver.Validator          = (*conn)(nil)
	_ driver.Pinger             = (*conn)(nil)
)

func (w *conn) Prepare(query string) (driver.Stmt, error) {
	return w.PrepareContext(context.Background(), query)
}

func (w *conn) PrepareContext(ctx context.Context, query string) (driver.Stmt, error) {
	var (
		st  driver.Stmt
		err error
	)
	if p, ok := w.inner.(driver.ConnPrepareContext); ok {
		st, err = p.PrepareContext(ctx, query)
	} else {
		st, err = w.inner.Prepare(query)
	}
	if err != nil {
		return nil, err
	}
	w.c.prepares.Add(1)
	return &stmt{inner: st, conn: w, query: query}, nil
}

func (w *conn) Close() error { return w.inner.Close() }

func (w *conn) Begin() (driver.Tx, error) {
	return w.BeginTx(context.Background(), driver.TxOptions{})
}

func (w *conn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	if held := w.c.held.Load(); held != nil {
		select {
		case <-*held:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	var (
		tx  driver.Tx
		err error
	)
	if b, ok := w.inner.(driver.ConnBeginTx); ok {
		tx, err = b.BeginTx(ctx, opts)
	} else {
		tx, err = w.inner.Begin() //nolint:staticcheck // fallback for old drivers
	}
	if err != nil {
		return nil, err
	}
	return &countedTx{inner: tx, c: w.c}, nil
}

// countedTx is a transaction of a counted pool: its ROLLBACK waits while
// HoldRollbacks holds them, and is counted once it returns.
type countedTx struct {
	inner driver.Tx
	c     *Counter
}

func (t *countedTx) Commit() error { return t.inner.Commit() }

func (t *countedTx) Rollback() error {
	if held := t.c.heldRollbacks.Load(); held != nil {
		<-*held
	}
	defer t.c.rollbacks.Add(1)
	err := t.inner.Rollback()
	if err != nil {
		t.c.rollbackErrs.Add(1)
	}
	return err
}

func (w *conn) ExecContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	e, ok := w.inner.(driver.ExecerContext)
	if !ok {
		return nil, driver.ErrSkip
	}
	r, err := e.ExecContext(ctx, query, args)
	if err != driver.ErrSkip {
		w.c.stmts.Add(1)
		w.c.ran(query)
	}
	return r, err
}

func (w *conn) QueryContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	q, ok := w.inner.(driver.QueryerContext)
	if !ok {
		return nil, driver.ErrSkip
	}
	r, err := q.QueryContext(ctx, query, args)
	if err != driver.ErrSkip {
		w.c.stmts.Add(1)
		w.c.ran(query)
	}
	return r, err
}

func (w *conn) CheckNamedValue(nv *driver.NamedValue) error {
	if c, ok := w.inner.(driver.NamedValueChecker); ok {
		return c.CheckNamedValue(nv)
	}
	return driver.ErrSkip
}

func (w *conn) ResetSession(ctx context.Context) error {
	if r, ok := w.inner.(driver.SessionResetter); ok {
		return r.ResetSession(ctx)
	}
	return nil
}

func (w *conn) IsValid() bool {
	if v, ok := w.inner.(driver.Validator); ok {
		return v.IsValid()
	}
	return true
}

func (w *conn) Ping(ctx context.Context) error {
	if p, ok := w.inner.(driver.Pinger); ok {
		return p.Ping(ctx)
	}
	return nil
}

type stmt struct {
	inner driver.Stmt
	conn  *conn
	query string
}

var (
	_ driver.StmtExecContext   = (*stmt)(nil)
	_ driver.StmtQueryContext  = (*stmt)(nil)
	_ driver.NamedValueChecker = (*stmt)(nil)
)

func (s *stmt) Close() error  { return s.inner.Close() }
func (s *stmt) NumInput() int { return s.inner.NumInput() }

func (s *stmt) Exec(args []driver.Value) (driver.Result, error) {
	s.conn.c.stmts.Add(1)
	r, err := s.inner.Exec(args) //nolint:staticcheck // the driver's own fallback
	s.conn.c.ran(s.query)
	return r, err
}

func (s *stmt) Query(args []driver.Value) (driver.Rows, error) {
	s.conn.c.stmts.Add(1)
	r, err := s.inner.Query(args) //nolint:staticcheck // the driver's own fallback
	s.conn.c.ran(s.query)
	return r, err
}

func (s *stmt) ExecContext(ctx context.Context, args []driver.NamedValue) (driver.Result, error) {
	e, ok := s.inner.(driver.StmtExecContext)
	if !ok {
		return s.Exec(values(args))
	}
	s.conn.c.stmts.Add(1)
	r, err := e.ExecContext(ctx, args)
	s.conn.c.ran(s.query)
	return r, err
}

func (s *stmt) QueryContext(ctx context.Context, args []driver.NamedValue) (driver.Rows, error) {
	q, ok := s.inner.(driver.StmtQueryContext)
	if !ok {
		return s.Query(values(args))
	}
	s.conn.c.stmts.Add(1)
	r, err := q.QueryContext(ctx, args)
	s.conn.c.ran(s.query)
	return r, err
}

func (s *stmt) CheckNamedValue(nv *driver.NamedValue) error {
	if c, ok := s.inner.(driver.NamedValueChecker); ok {
		return c.CheckNamedValue(nv)
	}
	return s.conn.CheckNamedValue(nv)
}

func values(args []driver.NamedValue) []driver.Value {
	v := make([]driver.Value, len(args))
	for i, a := range args {
		v[i] = a.Value
	}
	return v
}
