package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"regexp"
	"testing"
	"time"
)

// TestPaymentOutlivesItsClient: on every database, a payment (a leased
// route that calls the provider) whose client gives up while it runs
// completes anyway, and the client's retry gets its 201 (replayed): one
// provider charge, one charge row, one execution, never a 503 replayed for
// the whole retention window.
//
// The client gives up once the service is seen running the payment (the
// provider has charged; the handler is in its work delay), not after a
// fixed time: a fixed client timeout (it was 300 ms) can end, on a loaded
// machine, before the service has even claimed the key; the retry then
// reaches the claim first and executes, the first request gets the 409,
// and the test failed on an executed 201 that was the key's first and only
// execution. The provider answers a repeated downstream key with its
// first charge, so the tables cannot show a second execution: the retry's
// Idempotent-Replayed and the one "executed" log line do.
//
// TestPaymentResolved: a payment that fails after the provider charged
// (recording the charge fails: the test takes the charges table away for
// the first attempt) is indeterminate; the retry is settled by the
// service's resolver from the provider's record of the downstream key:
// the 201 the handler would have sent, one provider charge, one charge row.
func TestPaymentOutlivesItsClient(t *testing.T) {
	for di, db := range databases {
		fw, store := frameworks[di], storeFor(di, 1)
		t.Run(db+"/"+fw+"/"+store, func(t *testing.T) {
			t.Parallel()
			c := config{framework: fw, store: store, db: newDatabase(t, db), extra: []string{"-work-delay", workDelay.String()}}
			s := startServer(t, "orders-pay", c)
			base := "http://" + s.addr
			path, account := payFor(t, base), "payer"
			key, body := "timeout-"+randomHex(8), `{"amount_cents":1500}`

			ctx, giveUp := context.WithCancel(context.Background())
			defer giveUp()
			first := make(chan result, 1)
			go func() {
				a, err := do(ctx, newClient(true), http.MethodPost, base+path, account, key, body)
				first <- result{a, err}
			}()
			waitFor(t, "the first attempt charging at the provider", 30*time.Second, func() bool {
				return c.db.count(t, `SELECT COUNT(*) FROM provider_charges WHERE amount_cents = 1500`) > 0
			})
			giveUp()
			if r := <-first; r.err == nil {
				t.Fatalf("the client did not give up: %v (answered within the %s work delay after the provider call)", r.a, workDelay)
			}
			retry, tries := retryUntilSettled(t, client, http.MethodPost, base+path, account, key, body, 30*time.Second)
			if retry.status != http.StatusCreated || !retry.replayed() {
				t.Fatalf("retry after the client gave up: %v, want the payment's 201 replayed", retry)
			}
			ch := decodeCharge(t, retry.body)
			wantOneCharge(t, c.db, ch, 1500)
			// The first attempt ran to its end and recorded its 201: the
			// retry replayed it (no resolver involved).
			// (The log hashes keys; the path names this payment.)
			executed := regexp.MustCompile(`path=` + regexp.QuoteMeta(path) + ` status=201 .*idempotency=executed `)
			waitFor(t, "the first attempt's log line (201, executed)", 10*time.Second, func() bool { return len(s.logs.grep(executed)) == 1 })
			if bad := s.logs.grep(regexp.MustCompile(`path=` + regexp.QuoteMeta(path) + ` .*idempotency=(indeterminate|resolved) `)); len(bad) > 0 {
				t.Errorf("the timed-out payment was left indeterminate:\n%s", bad)
			}
			t.Logf("the client gave up; its retry got the recorded 201 after %d tries", tries)
		})
	}
}

func TestPaymentResolved(t *testing.T) {
	for di, db := range databases {
		fw, store := frameworks[(di+1)%len(frameworks)], storeFor(di, 0)
		t.Run(db+"/"+fw+"/"+store, func(t *testing.T) {
			t.Parallel()
			c := config{framework: fw, store: store, db: newDatabase(t, db)}
			s := startServer(t, "orders-pay", c)
			base := "http://" + s.addr
			path, account := payFor(t, base), "payer"
			key, body := "settle-"+randomHex(8), `{"amount_cents":2500}`

			exec := func(q string) {
				t.Helper()
				if _, err := c.db.db.Exec(q); err != nil {
					t.Fatalf("%s: %s: %v", c.db.kind, q, err)
				}
			}
			exec(`ALTER TABLE charges RENAME TO charges_away`)
			first := mustDo(t, client, http.MethodPost, base+path, account, key, body)
			exec(`ALTER TABLE charges_away RENAME TO charges`)
			if first.status != http.StatusInternalServerError || first.replayed() {
				t.Fatalf("payment while the charges table is away: %v, want the handler's 500", first)
			}
			if n := c.db.count(t, `SELECT COUNT(*) FROM provider_charges WHERE amount_cents = 2500`); n != 1 {
				t.Fatalf("provider charges after the failed payment: %d, want 1 (it charged, then failed)", n)
			}
			retry := mustDo(t, client, http.MethodPost, base+path, account, key, body)
			if retry.status != http.StatusCreated || !retry.replayed() {
				t.Fatalf("retry of the indeterminate payment: %v, want the settled 201 replayed", retry)
			}
			if ct := retry.header.Get("Content-Type"); ct != "application/json" {
				t.Errorf("settled answer's Content-Type %q, want application/json", ct)
			}
			ch := decodeCharge(t, retry.body)
			wantOneCharge(t, c.db, ch, 2500)
			again := mustDo(t, client, http.MethodPost, base+path, account, key, body)
			if again.status != http.StatusCreated || !again.replayed() || !bytes.Equal(again.body, retry.body) {
				t.Errorf("another retry: %v, want the replay of %q", again, retry.body)
			}
			resolved := regexp.MustCompile(`path=` + regexp.QuoteMeta(path) + ` status=201 .*idempotency=resolved `)
			waitFor(t, "the resolver's log line", 10*time.Second, func() bool { return len(s.logs.grep(resolved)) == 1 })
		})
	}
}

// payFor creates an order for "payer" and returns its payment path.
func payFor(t *testing.T, base string) string {
	t.Helper()
	a := mustDo(t, client, http.MethodPost, base+"/orders", "payer", "payer-order-"+randomHex(4), orderBody("kite", 1))
	if a.status != http.StatusCreated {
		t.Fatalf("POST /orders: %v", a)
	}
	return fmt.Sprintf("/orders/%d/payments", decodeOrder(t, a.body).ID)
}

type charge struct {
	ID               int64  `json:"id"`
	OrderID          int64  `json:"order_id"`
	AmountCents      int64  `json:"amount_cents"`
	ProviderChargeID string `json:"provider_charge_id"`
}

func decodeCharge(t *testing.T, b []byte) charge {
	t.Helper()
	var ch charge
	if err := json.Unmarshal(b, &ch); err != nil || ch.ID == 0 || ch.ProviderChargeID == "" {
		t.Fatalf("not a charge: %q (%v)", b, err)
	}
	return ch
}

// wantOneCharge checks that the provider charged once for amount and that
// exactly that charge is recorded, once.
func wantOneCharge(t *testing.T, d *database, ch charge, amount int64) {
	t.Helper()
	if ch.AmountCents != amount {
		t.Errorf("charge of %d cents, want %d", ch.AmountCents, amount)
	}
	if n := d.count(t, `SELECT COUNT(*) FROM provider_charges WHERE amount_cents = ?`, amount); n != 1 {
		t.Errorf("provider charges of %d cents: %d, want exactly 1", amount, n)
	}
	if n := d.count(t, `SELECT COUNT(*) FROM provider_charges WHERE charge_id = ?`, ch.ProviderChargeID); n != 1 {
		t.Errorf("the charge's provider id %q is not the provider's charge", ch.ProviderChargeID)
	}
	if n := d.count(t, `SELECT COUNT(*) FROM charges WHERE amount_cents = ?`, amount); n != 1 {
		t.Errorf("recorded charges of %d cents: %d, want exactly 1", amount, n)
	}
}
