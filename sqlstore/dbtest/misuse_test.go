package dbtest_test

import (
	"context"
	"testing"

	"github.com/idemkit/idem/sqlstore"
	"github.com/idemkit/idem/sqlstore/sqlstoretest"
)

// TestTxWithoutTransactionFailsLoudly: sqlstore.Tx with a context that
// carries no transaction (not the request's) returns an error wrapping
// core.ErrNoTx that names the fix; in an atomic route it returns the
// request's transaction, in a Leased route the attempt's own.
func TestTxWithoutTransactionFailsLoudly(t *testing.T) {
	if tx, err := sqlstore.Tx(context.Background()); tx != nil || err == nil {
		t.Errorf("Tx without a transaction: %v, %v; want nil and an error", tx, err)
	}
	s, _, _ := newStore(t, sqlstore.SQLite)
	sqlstoretest.RunTxAccess(t, s, func(ctx context.Context) error {
		tx, err := sqlstore.Tx(ctx)
		if err == nil {
			_, err = tx.ExecContext(ctx, "SELECT 1")
		}
		return err
	}, "c.Request.Context()", nil)
}
