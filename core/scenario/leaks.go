package scenario

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/seal"
	"github.com/idemkit/idem/core/store"
)

// errSecret is a store, driver or caller-function error as real ones read:
// connection string, user name, host, SQL, SQLSTATE, a password. None of
// it may reach a client.
var errSecret = errors.New("sqlstore: begin: failed to connect to `user=billing_rw database=payments_prod`: " +
	"10.0.0.5:5432: SELECT id FROM idem_records WHERE id = $1: SQLSTATE 28P01: password authentication failed; ldap bind failed")

// secretMarkers are the parts of errSecret (and of the secret panic value
// and caller-function error) that must never appear in a response.
var secretMarkers = []string{"billing_rw", "payments_prod", "10.0.0.5", "SELECT", "SQLSTATE", "password", "ldap"}

// wantNoSecrets fails if any header or the body of res carries a marker.
func wantNoSecrets(t *testing.T, what string, res result) {
	t.Helper()
	for _, m := range secretMarkers {
		if strings.Contains(res.Body, m) {
			t.Errorf("%s: the body carries %q: %s", what, m, res.Body)
		}
		for name, vs := range res.Header {
			for _, v := range vs {
				if strings.Contains(v, m) {
					t.Errorf("%s: header %s carries %q: %s", what, name, m, v)
				}
			}
		}
	}
}

// recordID is the record_id member of a problem document ("" if none).
func recordID(res result) string {
	var p struct {
		RecordID string `json:"record_id"`
	}
	_ = json.Unmarshal([]byte(res.Body), &p)
	return p.RecordID
}

// wantLogged fails unless a log line at level or above contains every
// part (the internal error's text and the record's id).
func wantLogged(t *testing.T, x *harness, what string, level slog.Level, parts ...string) {
	t.Helper()
	for _, l := range x.logs() {
		if l.Level < level {
			continue
		}
		all := true
		for _, p := range parts {
			all = all && strings.Contains(l.Text, p)
		}
		if all {
			return
		}
	}
	t.Errorf("%s: no log line at %v or above contains %q", what, level, parts)
}

// switchSealer seals with AES-GCM and, while failing is set, fails to
// open with errSecret.
type switchSealer struct {
	seal.Sealer
	failing atomic.Bool
}

func (s *switchSealer) Open(id store.ID, sealed []byte) ([]byte, error) {
	if s.failing.Load() {
		return nil, errSecret
	}
	return s.Sealer.Open(id, sealed)
}

func testNoInternalsReachTheClient(t *testing.T, x *harness) {
	var n atomic.Int32
	g := x.gate()
	aes, err := seal.NewAESGCM(map[string][]byte{"k1": make([]byte, 32)}, "k1")
	if err != nil {
		t.Fatal(err)
	}
	sealer := &switchSealer{Sealer: aes}
	var resolverMu sync.Mutex
	x.start([]core.Option{
		core.WithCaller(func(r *http.Request) (string, error) {
			if r.Header.Get("X-Caller") == "ldap" {
				return "", fmt.Errorf("auth: %w", errSecret)
			}
			return callerFromHeader(r)
		}),
		core.WithSealer(sealer),
		core.WithMaxRequestBody(64),
		core.WithResolver(func(context.Context, store.Record) (core.Resolution, error) {
			resolverMu.Lock()
			defer resolverMu.Unlock()
			return core.Resolution{}, errSecret
		}),
	},
		Route{Method: "POST", Pattern: "/orders", Handler: orderHandler(&n)},
		heldOrdersAt("/held", g),
		Route{Method: "POST", Pattern: "/busy", Handler: func(w http.ResponseWriter, r *http.Request) {
			http.Error(w, "slow down", http.StatusTooManyRequests) // released
		}},
		Route{Method: "POST", Pattern: "/effect-panic", Handler: func(w http.ResponseWriter, r *http.Request) {
			core.MarkEffect(r.Context())
			panic(errSecret)
		}},
		Route{Method: "POST", Pattern: "/effect-503", Handler: func(w http.ResponseWriter, r *http.Request) {
			core.MarkEffect(r.Context())
			http.Error(w, "provider unavailable", http.StatusServiceUnavailable)
		}},
		Route{Method: "POST", Pattern: "/fp", Options: []core.RouteOption{core.Fingerprint(func(*http.Request, string, []byte) ([]byte, error) {
			return nil, errSecret
		})}, Handler: orderHandler(&n)},
	)

	// storeFault sends one request while op fails and returns its answer;
	// the store works again afterwards.
	storeFault := func(op uint32, path, key string) result {
		x.hooks.failing.Store(op)
		defer x.hooks.failing.Store(0)
		return x.do(post(path, orderJSON, key))
	}
	// wantHiddenStoreError: a 503 store-unavailable without the internals,
	// whose record_id finds the internal error in the log.
	wantHiddenStoreError := func(what string, res result) {
		t.Helper()
		wantProblem(t, res, http.StatusServiceUnavailable, "store-unavailable")
		wantNoSecrets(t, what, res)
		id := recordID(res)
		if id == "" {
			t.Errorf("%s: the problem has no record_id: %s", what, res.Body)
			return
		}
		wantLogged(t, x, what, slog.LevelError, "id="+id, "billing_rw")
	}

	wantHiddenStoreError("store down at claim", storeFault(opClaim, "/orders", "claim"))
	if x.mode == atomicMode {
		wantHiddenStoreError("store down at begin", storeFault(opBegin, "/orders", "begin"))
		wantHiddenStoreError("store failing at complete", storeFault(opComplete, "/orders", "complete"))
		wantHiddenStoreError("store failing at commit", storeFault(opCommit, "/orders", "commit"))
	} else {
		// Leased: the effect happened, so the handler's answer is
		// delivered; the failure is logged.
		res := storeFault(opComplete, "/orders", "complete")
		wantNoSecrets(t, "leased, store failing at complete", res)
		wantLogged(t, x, "leased, store failing at complete", slog.LevelError, "billing_rw")
	}
	wantNoSecrets(t, "store failing at release", storeFault(opRelease, "/busy", "release"))

	// A replay whose record cannot be opened.
	wantOriginal(t, x.do(post("/orders", orderJSON, "replay")), http.StatusCreated, orderBody(int(n.Load()), "alice", orderJSON))
	sealer.failing.Store(true)
	wantHiddenStoreError("record that cannot be opened on replay", x.do(post("/orders", orderJSON, "replay")))
	sealer.failing.Store(false)

	// A caller function failing with internal text.
	res := x.do(post("/orders", orderJSON, "caller").as("ldap"))
	wantProblem(t, res, http.StatusUnauthorized, "unauthenticated")
	wantNoSecrets(t, "caller function failing", res)
	wantLogged(t, x, "caller function failing", slog.LevelWarn, "ldap bind failed")

	// A fingerprint function failing with internal text.
	res = x.do(post("/fp", orderJSON, "fp"))
	wantProblem(t, res, http.StatusBadRequest, "invalid-request")
	wantNoSecrets(t, "fingerprint function failing", res)
	// The function's own failure is the server's to act on, as a caller
	// function's is: logged at WARN, not hidden at DEBUG.
	wantLogged(t, x, "fingerprint function failing", slog.LevelWarn, "fingerprint: sqlstore", "billing_rw")

	// A panic with internal text after MarkEffect: the recorded (and
	// replayed) problem does not carry the panic value.
	_ = x.do(post("/effect-panic", orderJSON, "panic"))
	res = x.do(post("/effect-panic", orderJSON, "panic"))
	wantProblem(t, res, http.StatusInternalServerError, "internal")
	wantNoSecrets(t, "replay of a panic after MarkEffect", res)

	// A resolver failing with internal text: the recorded 5xx is replayed.
	_ = x.do(post("/effect-503", orderJSON, "resolver"))
	res = x.do(post("/effect-503", orderJSON, "resolver"))
	wantStatus(t, res, http.StatusServiceUnavailable)
	wantNoSecrets(t, "resolver failing", res)
	wantLogged(t, x, "resolver failing", slog.LevelWarn, "billing_rw")

	// The client's own mistakes.
	for _, c := range []struct {
		what   string
		req    *request
		status int
		slug   string
	}{
		{"missing key", post("/orders", orderJSON, ""), http.StatusBadRequest, "missing-key"},
		{"invalid key", post("/orders", orderJSON, "a\x01b"), http.StatusBadRequest, "invalid-key"},
		{"body too large", post("/orders", strings.Repeat("x", 100), "large"), http.StatusRequestEntityTooLarge, "body-too-large"},
		{"mismatch", post("/orders", `{"amount":1}`, "replay"), http.StatusUnprocessableEntity, "key-reused"},
	} {
		res := x.do(c.req)
		wantProblem(t, res, c.status, c.slug)
		wantNoSecrets(t, c.what, res)
	}

	// In progress.
	firstCh := x.goDo(post("/held", orderJSON, "held"))
	x.waitEntered(g, "first request")
	res = x.await(x.goDo(post("/held", orderJSON, "held")), "duplicate in flight")
	wantProblem(t, res, http.StatusConflict, "in-progress")
	wantNoSecrets(t, "in progress", res)
	g.open()
	x.await(firstCh, "first request")
}

// heldOrdersAt is a route at path whose first execution holds at g.
func heldOrdersAt(path string, g *gate) Route {
	var n atomic.Int32
	r := heldOrders(&n, g)
	r.Pattern = path
	return r
}

// testRoutineDecisionsLogQuietly: a storm of duplicates of one key while
// the first runs logs every 409 at DEBUG.
func testRoutineDecisionsLogQuietly(t *testing.T, x *harness) {
	const storm = 30
	var n atomic.Int32
	g := x.gate()
	x.start(nil, heldOrders(&n, g))

	firstCh := x.goDo(post("/orders", orderJSON, "storm"))
	x.waitEntered(g, "first request")
	for i := range storm - 1 {
		res := x.await(x.goDo(post("/orders", orderJSON, "storm")), fmt.Sprintf("duplicate %d", i))
		wantProblem(t, res, http.StatusConflict, "in-progress")
	}
	g.open()
	x.await(firstCh, "first request")
	// Replays and mismatches are routine too.
	_ = x.do(post("/orders", orderJSON, "storm"))
	_ = x.do(post("/orders", `{"amount":1}`, "storm"))

	busy := 0
	for _, l := range x.logs() {
		if strings.Contains(l.Text, "decision=in_progress") {
			busy++
		}
		if l.Level > slog.LevelDebug {
			t.Errorf("a routine decision logged at %v: %s", l.Level, l.Text)
		}
	}
	if busy != storm-1 {
		t.Errorf("%d in-progress decisions logged, want %d", busy, storm-1)
	}
}
