package dbtest_test

// A MariaDB deadlock victim whose handler writes on (found by an
// adversarial review, 2026-12-08; failed before the engine stopped
// releasing a claim that vanished from its open transaction).

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/idemkit/idem/sqlstore"
)

func isDeadlock(err error) bool {
	var me *mysql.MySQLError
	return errors.As(err, &me) && me.Number == 1213
}

// TestDeadlockVictimThenWrites: MariaDB, atomic mode, no
// MarkEffect. The handler's transaction is chosen as a deadlock victim
// (1213): InnoDB rolls back the whole transaction, the claim included,
// and the session goes back to autocommit while the *sql.Tx that
// sqlstore.Tx handed out still looks open. The handler retries the
// failed statement (a common "retry on deadlock" helper) and writes its
// payment: both statements autocommit. The engine's completion finds no
// claim, afterEnd reads "absent, no effect", answers 503 and frees the
// key, so the client's retry runs the handler again: two debits, two
// payments for one key.
func TestDeadlockVictimThenWrites(t *testing.T) {
	f := fixture(t, sqlstore.MySQL)
	st := f.Store.(*sqlstore.Store)
	accts := st.Table() + "_acct"
	heavy := st.Table() + "_heavy"
	f.Admin(t, "CREATE TABLE "+accts+" (id INT PRIMARY KEY, n INT NOT NULL) ENGINE=InnoDB")
	f.Admin(t, "CREATE TABLE "+heavy+" (id INT PRIMARY KEY) ENGINE=InnoDB")
	t.Cleanup(func() { f.Admin(t, "DROP TABLE IF EXISTS "+accts); f.Admin(t, "DROP TABLE IF EXISTS "+heavy) })
	f.Admin(t, "INSERT INTO "+accts+" VALUES (1, 0), (2, 0)")
	e := guardEngine(t, nil, st)

	var runs, deadlocks atomic.Int64
	h := e.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		ctx := r.Context()
		tx, err := sqlstore.Tx(ctx)
		if err != nil {
			http.Error(w, err.Error(), 500)
			return
		}
		first := runs.Load() == 1
		var side chan error
		if first {
			// Another transaction of the application (heavier: it wrote
			// more rows) locks account 2, then waits for account 1.
			other, err := f.DB.BeginTx(context.Background(), nil)
			if err != nil {
				http.Error(w, err.Error(), 500)
				return
			}
			for i := range 50 {
				if _, err := other.Exec(fmt.Sprintf("INSERT INTO %s VALUES (%d)", heavy, i)); err != nil {
					http.Error(w, err.Error(), 500)
					return
				}
			}
			if _, err := other.Exec("UPDATE " + accts + " SET n = n + 1 WHERE id = 2"); err != nil {
				http.Error(w, err.Error(), 500)
				return
			}
			if _, err := tx.ExecContext(ctx, "UPDATE "+accts+" SET n = n + 1 WHERE id = 1"); err != nil {
				http.Error(w, err.Error(), 500)
				return
			}
			side = make(chan error, 1)
			go func() {
				_, err := other.Exec("UPDATE " + accts + " SET n = n + 1 WHERE id = 1")
				if err == nil {
					err = other.Commit()
				} else {
					_ = other.Rollback()
				}
				side <- err
			}()
			time.Sleep(300 * time.Millisecond) // the other transaction waits for account 1
		}
		// The debit, retried once on a deadlock, as the InnoDB manual's
		// "try restarting transaction" is often read.
		debit := func() error {
			_, err := tx.ExecContext(ctx, "UPDATE "+accts+" SET n = n + 100 WHERE id = 2")
			return err
		}
		err = debit()
		if isDeadlock(err) {
			deadlocks.Add(1)
			err = debit()
		}
		if err != nil {
			http.Error(w, "debit: "+err.Error(), 500)
			return
		}
		if err := f.Insert(ctx, "payment-1"); err != nil {
			http.Error(w, "insert: "+err.Error(), 500)
			return
		}
		if side != nil {
			<-side
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprint(w, `{"paid":100}`)
	}))

	first := guardPost(h, "deadlock-key")
	t.Logf("first: %d %s (deadlocks seen by the handler: %d)", first.status, first.body, deadlocks.Load())
	if deadlocks.Load() == 0 {
		t.Fatalf("no deadlock was provoked; the scenario did not happen")
	}
	rowsAfterFirst := f.Count(t, "payment-1")
	t.Logf("payment rows committed after the first attempt: %d", rowsAfterFirst)
	retry := guardPost(h, "deadlock-key")
	t.Logf("retry: %d %s replayed=%v", retry.status, retry.body, retry.replay)
	rows := f.Count(t, "payment-1")
	var bal int
	if err := f.DB.QueryRow("SELECT n FROM " + accts + " WHERE id = 2").Scan(&bal); err != nil {
		t.Fatal(err)
	}
	t.Logf("account 2 after both attempts: %d (the other transaction's +1, and +100 per debit)", bal)
	if runs.Load() > 1 && rowsAfterFirst > 0 {
		t.Fatalf("the handler ran %d times for one key; %d payment rows committed (%d after the first attempt, which answered %d): the first attempt's writes committed in autocommit after the deadlock, and the engine released the key",
			runs.Load(), rows, rowsAfterFirst, first.status)
	}
}
