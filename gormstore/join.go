package gormstore

import (
	"context"
	"database/sql"
	"fmt"
	"sync/atomic"

	"gorm.io/gorm"
)

// joiningPool is the connection pool Plugin puts in front of the
// application's: a transaction that a repository opens itself with the
// request's context (db.WithContext(ctx).Transaction(...), db.Begin())
// while that context carries a live transaction of the same database
// joins it as GORM joins a nested transaction: a savepoint in it. The
// repository's commit releases the savepoint, its rollback rolls back to
// it, and the request's claim and completion are untouched. Everything
// else goes to the pool as it is.
type joiningPool struct {
	gorm.ConnPool
}

// savepoints numbers the savepoints joiningPool opens (unique per process,
// so nested repositories never reuse a name in one transaction).
var savepoints atomic.Uint64

// BeginTx implements gorm.ConnPoolBeginner.
func (p joiningPool) BeginTx(ctx context.Context, opts *sql.TxOptions) (gorm.ConnPool, error) {
	if req := liveTx(ctx); req != nil && p.sameDB(req) {
		conn := req.Statement.ConnPool
		name := fmt.Sprintf("idem_sp%d", savepoints.Add(1))
		if _, err := conn.ExecContext(ctx, "SAVEPOINT "+name); err != nil {
			return nil, fmt.Errorf("gormstore: joining the request's transaction (SAVEPOINT): %w", err)
		}
		return &savepointPool{ConnPool: conn, req: req, name: name, ctx: ctx}, nil
	}
	switch b := p.ConnPool.(type) {
	case gorm.ConnPoolBeginner:
		return b.BeginTx(ctx, opts)
	case gorm.TxBeginner:
		return b.BeginTx(ctx, opts)
	}
	return nil, gorm.ErrInvalidTransaction
}

// GetDBConn implements gorm.GetDBConnector (db.DB()).
func (p joiningPool) GetDBConn() (*sql.DB, error) { return poolDB(p.ConnPool) }

// sameDB reports whether the request's transaction runs on this pool's
// database.
func (p joiningPool) sameDB(req *gorm.DB) bool {
	a, err := poolDB(p.ConnPool)
	if err != nil {
		return false
	}
	b, err := req.DB()
	return err == nil && a == b
}

// poolDB is the *sql.DB behind a GORM connection pool.
func poolDB(c gorm.ConnPool) (*sql.DB, error) {
	switch v := c.(type) {
	case *sql.DB:
		return v, nil
	case gorm.GetDBConnector:
		return v.GetDBConn()
	}
	return nil, gorm.ErrInvalidDB
}

// savepointPool is a repository's own transaction joined to the request's
// (joiningPool.BeginTx): its statements run in the request's transaction,
// its Commit releases the savepoint and its Rollback rolls back to it.
type savepointPool struct {
	gorm.ConnPool // the request's transaction
	req           *gorm.DB
	name          string
	ctx           context.Context
	done          bool
}

// Commit implements gorm.TxCommitter.
func (s *savepointPool) Commit() error {
	if s.done {
		return sql.ErrTxDone
	}
	s.done = true
	_, err := s.ConnPool.ExecContext(s.ctx, "RELEASE SAVEPOINT "+s.name)
	return err
}

// Rollback implements gorm.TxCommitter.
func (s *savepointPool) Rollback() error {
	if s.done {
		return sql.ErrTxDone
	}
	s.done = true
	_, err := s.ConnPool.ExecContext(s.ctx, "ROLLBACK TO SAVEPOINT "+s.name)
	return err
}

// GetDBConn implements gorm.GetDBConnector (db.DB()).
func (s *savepointPool) GetDBConn() (*sql.DB, error) { return s.req.DB() }

// StmtContext implements gorm.Tx (GORM's prepared-statement mode wraps a
// transaction that has it): a statement prepared on the pool, run in the
// request's transaction.
func (s *savepointPool) StmtContext(ctx context.Context, stmt *sql.Stmt) *sql.Stmt {
	if t, ok := s.ConnPool.(interface {
		StmtContext(context.Context, *sql.Stmt) *sql.Stmt
	}); ok {
		return t.StmtContext(ctx, stmt)
	}
	return stmt
}
