package dbtest_test

import (
	"context"
	"errors"
	"testing"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/gormstore"
	"github.com/idemkit/idem/sqlstore"
	"github.com/idemkit/idem/sqlstore/sqlstoretest"
)

// TestDBWithoutTransactionFailsLoudly: gormstore.DB never returns nil.
// With a context that carries no transaction (not the request's) it
// returns a *gorm.DB whose statements fail with an
// error wrapping core.ErrNoTx that names the fix; in an atomic route it is
// the request's transaction.
func TestDBWithoutTransactionFailsLoudly(t *testing.T) {
	type row struct{ Name string }
	if db := gormstore.DB(context.Background()); db == nil || !errors.Is(db.Error, core.ErrNoTx) {
		t.Fatalf("gormstore.DB without a transaction: %v, want a *gorm.DB carrying core.ErrNoTx", db)
	}
	if gormstore.TxFrom(context.Background()) != nil {
		t.Error("TxFrom without a transaction is not nil")
	}
	s, gdb, _ := newStore(t, sqlstore.SQLite)
	if err := gdb.Table("rows").AutoMigrate(&row{}); err != nil {
		t.Fatal(err)
	}
	sqlstoretest.RunTxAccess(t, s, func(ctx context.Context) error {
		return gormstore.DB(ctx).Table("rows").Create(&row{Name: "x"}).Error
	}, "c.Request.Context()", func(t *testing.T) {
		var n int64
		if err := gdb.Table("rows").Count(&n).Error; err != nil || n != 2 {
			t.Fatalf("rows committed by the leased and the atomic route: %d, %v; want 2", n, err)
		}
	})
}
