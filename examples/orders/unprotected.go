package main

import (
	"bytes"
	"context"
	"database/sql"
	"net/http"

	"gorm.io/gorm"

	"github.com/idemkit/idem/gormstore"
	"github.com/idemkit/idem/sqlstore"
)

// The hidden flag -unprotected-route registers POST /orders-unprotected:
// createOrder in its own transaction, with no idempotency middleware, as
// the baseline of the end-to-end benchmark (scripts/bench-e2e.sh). Like
// the protected route in atomic mode, the wrapper holds the response until
// the transaction has committed (rolled back on a 5xx), and puts the
// transaction in the context the way the middleware does, so the handler
// code is the same.

// txBeginner begins the business transaction and returns the context
// carrying it.
type txBeginner func(ctx context.Context) (context.Context, func() error, func() error, error)

func sqlTx(db *sql.DB, dialect string) txBeginner {
	return func(ctx context.Context) (context.Context, func() error, func() error, error) {
		tx, err := db.BeginTx(ctx, txOptions(dialect))
		if err != nil {
			return nil, nil, nil, err
		}
		return sqlstore.WithTx(ctx, tx), tx.Commit, tx.Rollback, nil
	}
}

func gormTx(db *gorm.DB, dialect string) txBeginner {
	return func(ctx context.Context) (context.Context, func() error, func() error, error) {
		tx := db.WithContext(ctx).Begin(txOptions(dialect))
		if tx.Error != nil {
			return nil, nil, nil, tx.Error
		}
		return gormstore.WithTx(ctx, tx), func() error { return tx.Commit().Error }, func() error { return tx.Rollback().Error }, nil
	}
}

// txOptions are the stores' own: READ COMMITTED on MySQL/MariaDB.
func txOptions(dialect string) *sql.TxOptions {
	if dialect == "mysql" {
		return &sql.TxOptions{Isolation: sql.LevelReadCommitted}
	}
	return nil
}

// inTx runs next in a transaction from begin and sends its response once
// the transaction has committed.
func inTx(begin txBeginner, next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		ctx, commit, rollback, err := begin(r.Context())
		if err != nil {
			problem(w, http.StatusServiceUnavailable, "unavailable", "could not begin a transaction")
			return
		}
		hw := &heldWriter{h: w.Header(), status: http.StatusOK}
		next(hw, r.WithContext(ctx))
		if hw.status >= 500 {
			_ = rollback()
		} else if err := commit(); err != nil {
			clear(w.Header())
			problem(w, http.StatusServiceUnavailable, "unavailable", "could not commit")
			return
		}
		w.WriteHeader(hw.status)
		_, _ = w.Write(hw.body.Bytes())
	}
}

// heldWriter holds a response until inTx sends it.
type heldWriter struct {
	h      http.Header
	status int
	wrote  bool
	body   bytes.Buffer
}

func (w *heldWriter) Header() http.Header { return w.h }

func (w *heldWriter) WriteHeader(code int) {
	if !w.wrote && code >= 200 {
		w.status, w.wrote = code, true
	}
}

func (w *heldWriter) Write(b []byte) (int, error) {
	w.wrote = true
	return w.body.Write(b)
}
