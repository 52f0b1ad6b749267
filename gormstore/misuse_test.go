package gormstore_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/gormstore"
	"github.com/idemkit/idem/sqlstore"
)

// TestDBWithoutTransactionFailsLoudly: gormstore.DB never returns nil.
// With a context that carries no transaction (not the request's, or a
// Leased route's) it returns a *gorm.DB whose statements fail with an
// error wrapping core.ErrNoTx that names the fix; in an atomic route it is
// the request's transaction.
func TestDBWithoutTransactionFailsLoudly(t *testing.T) {
	type row struct{ Name string }
	wantNoTx := func(t *testing.T, what string, err error, hint string) {
		t.Helper()
		if !errors.Is(err, core.ErrNoTx) {
			t.Fatalf("%s: error %v, want core.ErrNoTx", what, err)
		}
		if !strings.Contains(err.Error(), hint) {
			t.Errorf("%s: error %q does not say %q", what, err, hint)
		}
	}
	t.Run("NotTheRequestsContext", func(t *testing.T) {
		db := gormstore.DB(context.Background())
		if db == nil {
			t.Fatal("gormstore.DB returned nil")
		}
		wantNoTx(t, "DB(ctx).Error", db.Error, "c.Request.Context()")
		wantNoTx(t, "DB(ctx).Create", db.Table("rows").Create(&row{Name: "x"}).Error, "c.Request.Context()")
		if gormstore.TxFrom(context.Background()) != nil {
			t.Error("TxFrom without a transaction is not nil")
		}
	})

	s, gdb, _ := newStore(t, sqlstore.SQLite)
	if err := gdb.Table("rows").AutoMigrate(&row{}); err != nil {
		t.Fatal(err)
	}
	e, err := core.New(s, core.WithSingleCaller(), core.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
	if err != nil {
		t.Fatal(err)
	}
	var leasedErr, atomicErr error
	leased := e.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		leasedErr = gormstore.DB(r.Context()).Table("rows").Create(&row{Name: "leased"}).Error
	}), core.Scope("leased"), core.Leased())
	atomic := e.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		atomicErr = gormstore.DB(r.Context()).Table("rows").Create(&row{Name: "atomic"}).Error
		w.WriteHeader(http.StatusCreated)
	}), core.Scope("atomic"))
	send := func(h http.Handler) {
		r := httptest.NewRequest("POST", "/", nil)
		r.Header.Set(core.HeaderKey, "k1")
		h.ServeHTTP(httptest.NewRecorder(), r)
	}
	t.Run("LeasedRoute", func(t *testing.T) {
		send(leased)
		wantNoTx(t, "a Leased route", leasedErr, "this route is Leased: idem holds no transaction for it; use your own *gorm.DB")
	})
	t.Run("AtomicRoute", func(t *testing.T) {
		send(atomic)
		if atomicErr != nil {
			t.Fatalf("DB in an atomic route: %v", atomicErr)
		}
		var n int64
		if err := gdb.Table("rows").Where("name = ?", "atomic").Count(&n).Error; err != nil || n != 1 {
			t.Fatalf("the atomic route's row: %d, %v", n, err)
		}
	})
}
