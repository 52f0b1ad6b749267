package e2e

import (
	"bytes"
	"encoding/json"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// recordInfo is what idemctl prints of a record with -json.
type recordInfo struct {
	ID       string `json:"record_id"`
	State    string `json:"state"`
	Key      string `json:"key"`
	Status   int    `json:"status"`
	Response *struct {
		Body string `json:"body"`
	} `json:"response"`
}

// ctl runs idemctl against d's database and returns its standard output
// and exit status.
func ctl(t *testing.T, d *database, args ...string) (string, int) {
	t.Helper()
	args = append(args[:1:1], append([]string{"-dsn", d.serviceDSN, "-db", d.kind, "-json"}, args[1:]...)...)
	cmd := exec.Command(idemctl, args...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("idemctl %s: %v", strings.Join(args, " "), err)
	}
	if testing.Verbose() {
		t.Logf("idemctl %s: exit %d\n%s%s", args[0], code, out.String(), errOut.String())
	}
	return out.String(), code
}

// listed returns the record of key among the records idemctl lists in
// state st.
func listed(t *testing.T, d *database, st, key string) (recordInfo, bool) {
	t.Helper()
	out, code := ctl(t, d, "list", "-state", st)
	if code != 0 {
		t.Fatalf("idemctl list -state %s: exit %d: %s", st, code, out)
	}
	var page struct {
		Records []recordInfo `json:"records"`
	}
	if err := json.Unmarshal([]byte(out), &page); err != nil {
		t.Fatalf("idemctl list -json: %v: %q", err, out)
	}
	for _, r := range page.Records {
		if r.Key == key {
			return r, true
		}
	}
	return recordInfo{}, false
}

// TestPaymentSettledWithoutClient: on every database, a payment that
// fails after the provider charged (the charges table is away for the
// first attempt) is indeterminate, and its client never comes back. The
// service's completer settles it on its own: its resolver records the
// missing charge from the recorded request, once, and idemctl, run on the
// service's database, shows the record completed with that 201, which a
// late retry gets replayed. A second payment on a service without a
// completer stays indeterminate: idemctl lists it, refuses to release it
// without a reason, and releases it, so the next retry runs and pays.
func TestPaymentSettledWithoutClient(t *testing.T) {
	for di, db := range databases {
		fw, store := frameworks[(di+2)%len(frameworks)], storeFor(di, 2)
		t.Run(db+"/"+fw+"/"+store, func(t *testing.T) {
			t.Parallel()
			d := newDatabase(t, db)
			c := config{framework: fw, store: store, db: d, extra: []string{"-complete-every", "100ms", "-lease", "1s"}}
			s := startServer(t, "orders-completer", c)
			base := "http://" + s.addr
			exec := func(q string) {
				t.Helper()
				if _, err := d.db.Exec(q); err != nil {
					t.Fatalf("%s: %s: %v", d.kind, q, err)
				}
			}
			fail := func(base, key, body string) string {
				t.Helper()
				path := payFor(t, base)
				exec(`ALTER TABLE charges RENAME TO charges_away`)
				first := mustDo(t, client, http.MethodPost, base+path, "payer", key, body)
				exec(`ALTER TABLE charges_away RENAME TO charges`)
				if first.status != http.StatusInternalServerError {
					t.Fatalf("payment while the charges table is away: %v, want the handler's 500", first)
				}
				return path
			}

			key, body := "unattended-"+randomHex(8), `{"amount_cents":3100}`
			path := fail(base, key, body)
			waitFor(t, "the completer recording the charge", 30*time.Second, func() bool {
				return d.count(t, `SELECT COUNT(*) FROM charges WHERE amount_cents = 3100`) == 1
			})
			rec, ok := listed(t, d, "completed", key)
			if !ok || rec.Status != http.StatusCreated {
				t.Fatalf("idemctl list -state completed: %+v (found %v), want the settled 201", rec, ok)
			}
			out, code := ctl(t, d, "show", rec.ID)
			var shown recordInfo
			if code != 0 || json.Unmarshal([]byte(out), &shown) != nil || shown.Response == nil || !strings.Contains(shown.Response.Body, `"amount_cents":3100`) {
				t.Fatalf("idemctl show: exit %d %q, want the completed record with its charge", code, out)
			}
			late := mustDo(t, client, http.MethodPost, base+path, "payer", key, body)
			if late.status != http.StatusCreated || !late.replayed() {
				t.Fatalf("the late retry: %v, want the completer's 201 replayed", late)
			}
			wantOneCharge(t, d, decodeCharge(t, late.body), 3100)
			if _, code := ctl(t, d, "release", rec.ID, "-reason", "test"); code == 0 {
				t.Errorf("idemctl release of a completed record succeeded")
			}

			// A service without a completer leaves the record to the operator.
			manual := startServer(t, "orders-manual", config{framework: fw, store: store, db: d, extra: []string{"-complete-every", "0"}})
			mbase := "http://" + manual.addr
			key2, body2 := "operator-"+randomHex(8), `{"amount_cents":3200}`
			path2 := fail(mbase, key2, body2)
			// (The first service's completer may settle it too: both
			// outcomes are an operator's to read; wait for either.)
			var stuck recordInfo
			waitFor(t, "idemctl listing the payment", 10*time.Second, func() bool {
				var ok bool
				if stuck, ok = listed(t, d, "indeterminate", key2); ok {
					return true
				}
				stuck, ok = listed(t, d, "completed", key2)
				return ok
			})
			if stuck.State == "indeterminate" {
				if _, code := ctl(t, d, "release", stuck.ID); code != 2 {
					t.Errorf("idemctl release without -reason: exit %d, want 2", code)
				}
				if _, code := ctl(t, d, "release", stuck.ID, "-reason", "e2e: the operator releases it"); code != 0 {
					// Settled meanwhile by the other service's completer.
					if _, ok := listed(t, d, "completed", key2); !ok {
						t.Fatalf("idemctl release failed and the record is not completed")
					}
				}
			}
			again := mustDo(t, client, http.MethodPost, mbase+path2, "payer", key2, body2)
			if again.status != http.StatusCreated {
				t.Fatalf("the retry after the operator's release: %v, want 201", again)
			}
			wantOneCharge(t, d, decodeCharge(t, again.body), 3200)
		})
	}
}
