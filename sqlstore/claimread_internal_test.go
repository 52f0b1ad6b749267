package sqlstore

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"testing"

	"github.com/go-sql-driver/mysql"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/store"
)

// A claim's read of the committed row that the database aborts (a
// deadlock victim, or a Galera node's brute-force abort: 1213) inside the
// caller's transaction reports that the transaction is dead
// (core.ErrTxAborted) as well as the lost race, as the probe's error
// does: the caller must roll back.
func TestClaimReadAbortedInTheCallersTransaction(t *testing.T) {
	db := sql.OpenDB(abortingConnector{})
	t.Cleanup(func() { _ = db.Close() })
	s, err := New(db, MySQL)
	if err != nil {
		t.Fatal(err)
	}
	tx, err := db.BeginTx(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback() })
	_, _, err = s.claimReadMySQL(WithTx(t.Context(), tx), tx, store.ClaimRequest{ID: store.ID{1}})
	if !errors.Is(err, core.ErrTxAborted) || !errors.Is(err, core.ErrLostRace) {
		t.Errorf("claim read aborted in the caller's transaction: %v, want an error matching ErrTxAborted and ErrLostRace", err)
	}
}

// abortingConnector is a database/sql driver whose every query fails as
// MariaDB fails a statement of an aborted transaction.
type abortingConnector struct{}

func (abortingConnector) Connect(context.Context) (driver.Conn, error) { return abortingConn{}, nil }
func (abortingConnector) Driver() driver.Driver                        { return abortingDriver{} }

type abortingDriver struct{}

func (abortingDriver) Open(string) (driver.Conn, error) { return abortingConn{}, nil }

type abortingConn struct{}

func (abortingConn) Prepare(string) (driver.Stmt, error) {
	return nil, errors.New("abortingConn: no prepared statements")
}
func (abortingConn) Close() error              { return nil }
func (abortingConn) Begin() (driver.Tx, error) { return abortingTx{}, nil }
func (abortingConn) QueryContext(context.Context, string, []driver.NamedValue) (driver.Rows, error) {
	return nil, &mysql.MySQLError{Number: 1213, Message: "Deadlock found when trying to get lock; try restarting transaction"}
}

type abortingTx struct{}

func (abortingTx) Commit() error   { return nil }
func (abortingTx) Rollback() error { return nil }
