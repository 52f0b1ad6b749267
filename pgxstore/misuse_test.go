package pgxstore_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/pgxstore"
	"github.com/idemkit/idem/sqlstore"
)

// TestTxWithoutTransaction: a handler that asks for the transaction with a
// context that carries none fails loudly with core.ErrNoTx, naming the fix.
func TestTxWithoutTransaction(t *testing.T) {
	tx, err := pgxstore.Tx(context.Background())
	if tx != nil || !errors.Is(err, core.ErrNoTx) || !strings.Contains(err.Error(), "r.Context()") {
		t.Fatalf("Tx(background) = %v, %v; want nil and an error wrapping core.ErrNoTx naming the request's context", tx, err)
	}
	if pgxstore.TxFrom(context.Background()) != nil {
		t.Fatal("TxFrom(background) is not nil")
	}
}

// TestHandlerTxCommitRollbackRefused: idem owns the transaction it hands a
// handler; Commit and Rollback on it fail with core.ErrConfig and change
// nothing (the claim and the business row still commit with the engine).
func TestHandlerTxCommitRollbackRefused(t *testing.T) {
	f := fixture(t)
	ctx := context.Background()
	tctx, owner, err := f.Store.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	tx, err := pgxstore.Tx(tctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Insert(tctx, "kept"); err != nil {
		t.Fatal(err)
	}
	for name, call := range map[string]func(context.Context) error{"Commit": tx.Commit, "Rollback": tx.Rollback} {
		if err := call(ctx); !errors.Is(err, core.ErrConfig) {
			t.Errorf("%s on the handler's transaction = %v, want core.ErrConfig", name, err)
		}
	}
	// A savepoint works as pgx's.
	sp, err := tx.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Insert(tctx, "undone"); err != nil {
		t.Fatal(err)
	}
	if err := sp.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := owner.Commit(); err != nil {
		t.Fatal(err)
	}
	if n := f.Count(t, "kept"); n != 1 {
		t.Errorf("kept rows = %d, want 1", n)
	}
	if n := f.Count(t, "undone"); n != 0 {
		t.Errorf("rows rolled back to the savepoint = %d, want 0", n)
	}
}

// TestSchemaIsSqlstores: pgxstore's table is sqlstore's Postgres table, so
// both stores (and sqlstore's migrations/postgres files) share it.
func TestSchemaIsSqlstores(t *testing.T) {
	s, err := pgxstore.New(openPool(t, nil), pgxstore.WithTable("t_x"))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := s.Schema(), sqlstore.Schema(sqlstore.Postgres, "t_x"); got != want {
		t.Fatalf("Schema() =\n%s\nwant sqlstore's\n%s", got, want)
	}
}

// TestCheck: Check passes on a migrated table and names Migrate on a
// missing one.
func TestCheck(t *testing.T) {
	s, pool, _ := newStore(t)
	ctx := context.Background()
	if err := s.Check(ctx); err != nil {
		t.Fatalf("Check after Migrate: %v", err)
	}
	missing, err := pgxstore.New(pool, pgxstore.WithTable("idem_missing_table"))
	if err != nil {
		t.Fatal(err)
	}
	if err := missing.Check(ctx); !errors.Is(err, core.ErrConfig) || !strings.Contains(err.Error(), "Migrate") {
		t.Fatalf("Check on a missing table = %v, want core.ErrConfig naming Migrate", err)
	}
}

// TestNow: the database clock is close to ours (a loopback server).
func TestNow(t *testing.T) {
	s, _, _ := newStore(t)
	now, err := s.Now(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if d := time.Since(now); d < -time.Minute || d > time.Minute {
		t.Fatalf("Now() = %v, %v from the host's clock", now, d)
	}
}
