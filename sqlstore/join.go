package sqlstore

import (
	"context"
	"database/sql"
	"fmt"
	"sync/atomic"
)

// Beginner begins a repository's own transactions. A database/sql
// repository written against it, instead of *sql.DB, needs no change to
// run inside a protected request: Joining gives it one whose transactions
// join the request's.
//
//	type Repo struct{ db sqlstore.Beginner } // was *sql.DB
//
//	func (r Repo) Transfer(ctx context.Context, ...) error {
//		tx, err := r.db.BeginTx(ctx, nil)
//		if err != nil {
//			return err
//		}
//		defer tx.Rollback()
//		... tx.ExecContext(ctx, ...)
//		return tx.Commit()
//	}
type Beginner interface {
	BeginTx(ctx context.Context, opts *sql.TxOptions) (RepoTx, error)
}

// RepoTx is a transaction a Beginner began: a *sql.Tx of its own, or a
// savepoint in the request's transaction.
type RepoTx interface {
	Conn
	Commit() error
	Rollback() error
}

// Joining returns the Beginner over db for repositories (see Beginner).
// When the context given to BeginTx carries a transaction of the store's
// (the request's in atomic mode, a leased attempt's own, or one passed with
// WithTx), the repository's transaction joins it as a savepoint: its
// statements run in the request's transaction, its Commit releases the
// savepoint and its Rollback rolls back to it (its writes alone; the
// claim and the completion are untouched, and on Postgres a failed
// statement inside it no longer aborts the request's transaction). Without
// one, BeginTx is db.BeginTx. Give the repository the same *sql.DB the
// store runs on: a context's transaction is joined whatever database the
// Beginner was made for.
func Joining(db *sql.DB) Beginner { return joining{db} }

type joining struct{ db *sql.DB }

// savepoints numbers the savepoints Joining opens (unique per process, so
// nested repositories never reuse a name in one transaction).
var savepoints atomic.Uint64

func (j joining) BeginTx(ctx context.Context, opts *sql.TxOptions) (RepoTx, error) {
	c, err := ConnFrom(ctx)
	if err != nil {
		return nil, err
	}
	if c == nil {
		tx, err := j.db.BeginTx(ctx, opts)
		if err != nil {
			return nil, err
		}
		return tx, nil
	}
	name := fmt.Sprintf("idem_sp%d", savepoints.Add(1))
	if _, err := c.ExecContext(ctx, "SAVEPOINT "+name); err != nil {
		return nil, fmt.Errorf("sqlstore: joining the request's transaction (SAVEPOINT): %w", err)
	}
	return &savepoint{Conn: c, name: name, ctx: ctx}, nil
}

// savepoint is a repository's transaction joined to the request's.
type savepoint struct {
	Conn
	name string
	ctx  context.Context
	done bool
}

func (s *savepoint) Commit() error {
	if s.done {
		return sql.ErrTxDone
	}
	s.done = true
	_, err := s.ExecContext(s.ctx, "RELEASE SAVEPOINT "+s.name)
	return err
}

func (s *savepoint) Rollback() error {
	if s.done {
		return sql.ErrTxDone
	}
	s.done = true
	_, err := s.ExecContext(s.ctx, "ROLLBACK TO SAVEPOINT "+s.name)
	return err
}
