package sqlstore

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"testing"
	"time"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/store"
)

// A driver whose every statement is a MySQL deadlock victim and whose
// BEGIN fails: it drives claimMySQL's restart of a fresh transaction.
type fakeMySQLError struct{ Number uint16 }

func (e *fakeMySQLError) Error() string { return "Error 1213: Deadlock found" }

type deadlockDriver struct{}
type deadlockConn struct{}

func (deadlockDriver) Open(string) (driver.Conn, error) { return deadlockConn{}, nil }
func (deadlockConn) Prepare(string) (driver.Stmt, error) {
	return nil, &fakeMySQLError{erDeadlock}
}
func (deadlockConn) Close() error              { return nil }
func (deadlockConn) Begin() (driver.Tx, error) { return nil, errors.New("no transactions") }

type nopTx struct{}

func (nopTx) Commit() error   { return nil }
func (nopTx) Rollback() error { return nil }

func init() { sql.Register("idem-deadlock", deadlockDriver{}) }

// A claim that began Begin's transaction, lost to a deadlock, and cannot
// begin again returns the BEGIN error (it used to run on a nil connection
// and panic), and the registry lets the next claim of the id through.
func TestClaimRestartWhenBeginFails(t *testing.T) {
	db, err := sql.Open("idem-deadlock", "")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	s, err := New(db, MySQL)
	if err != nil {
		t.Fatal(err)
	}
	begins := 0
	beginOnce := func(context.Context) (Conn, store.Tx, error) {
		if begins++; begins == 1 {
			return db, nopTx{}, nil
		}
		return nil, nil, errors.New("begin: pool exhausted")
	}
	now := time.Now()
	req := store.ClaimRequest{ID: store.ID{1}, Token: 1, Now: now, ExpiresAt: now.Add(time.Hour)}
	ctx, tx, err := s.BeginWith(context.Background(), beginOnce)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if _, err := s.Claim(ctx, req); !errors.Is(err, core.ErrStoreUnavailable) {
		t.Fatalf("claim: %v, want ErrStoreUnavailable", err)
	}
	// The id is not left registered: another claim reaches the database
	// (and fails there) instead of waiting for the first.
	cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	begins = 0
	ctx2, tx2, err := s.BeginWith(cctx, beginOnce)
	if err != nil {
		t.Fatal(err)
	}
	defer tx2.Rollback()
	if _, err := s.Claim(ctx2, req); !errors.Is(err, core.ErrStoreUnavailable) || errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("second claim: %v, want the database's error, not a wait", err)
	}
}
