package scenario

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/idemkit/idem/core"
)

// Scenarios of recording and replay, keys and fingerprints.

const orderJSON = `{"amount":1000,"currency":"EUR"}`

func testFirstRuns(t *testing.T, x *harness) {
	var n atomic.Int32
	x.start(nil, Route{Method: "POST", Pattern: "/orders", Handler: orderHandler(&n)})

	res := x.do(post("/orders", orderJSON, "k1"))
	wantOriginal(t, res, http.StatusCreated, orderBody(1, "alice", orderJSON))
	if got := res.Header.Get("Location"); got != "/orders/1" {
		t.Errorf("Location %q, want /orders/1", got)
	}
	wantCalls(t, &n, 1)
}

func testReplay(t *testing.T, x *harness) {
	var n atomic.Int32
	x.start(nil, Route{Method: "POST", Pattern: "/orders", Handler: func(w http.ResponseWriter, r *http.Request) {
		i := n.Add(1)
		h := w.Header()
		h.Set("ETag", fmt.Sprintf(`"v%d"`, i))
		h.Add("Content-Language", "en")
		h.Add("Content-Language", "de")
		h.Add("Content-Language", "fr")
		writeOrder(w, r, int(i))
	}})

	first := x.do(post("/orders", orderJSON, "k1"))
	wantOriginal(t, first, http.StatusCreated, orderBody(1, "alice", orderJSON))
	if got := first.Header.Values("Content-Language"); len(got) != 3 {
		t.Fatalf("first answer Content-Language %q, want three values", got)
	}
	for i := range 2 {
		got := x.do(post("/orders", orderJSON, "k1"))
		wantReplay(t, first, got)
		if t.Failed() {
			t.Fatalf("duplicate %d", i+1)
		}
	}
	wantCalls(t, &n, 1)
}

func testRecordedStatuses(t *testing.T, x *harness) {
	type answer struct {
		status      int
		contentType string
		location    string
		body        string
		implicit    bool // no WriteHeader: 200 by default
	}
	answers := map[string]answer{
		"/implicit-200": {status: 200, implicit: true},
		"/200":          {status: 200, contentType: "application/json", body: `{"ok":true}`},
		"/204":          {status: 204},
		"/302":          {status: 302, location: "/elsewhere"},
		"/403":          {status: 403, contentType: "application/json", body: `{"error":"account frozen"}`},
		"/404":          {status: 404, contentType: "text/plain; charset=utf-8", body: "no such account\n"},
		"/409":          {status: 409, contentType: "application/json", body: `{"error":"already shipped"}`},
	}
	calls := map[string]*atomic.Int32{}
	var routes []Route
	for path, a := range answers {
		n := new(atomic.Int32)
		calls[path] = n
		routes = append(routes, Route{Method: "POST", Pattern: path, Handler: func(w http.ResponseWriter, r *http.Request) {
			n.Add(1)
			if a.contentType != "" {
				w.Header().Set("Content-Type", a.contentType)
			}
			if a.location != "" {
				w.Header().Set("Location", a.location)
			}
			if !a.implicit {
				w.WriteHeader(a.status)
			}
			_, _ = io.WriteString(w, a.body)
		}})
	}
	x.start(nil, routes...)

	for path, a := range answers {
		t.Run(strings.TrimPrefix(path, "/"), func(t *testing.T) {
			first := x.do(post(path, orderJSON, "k"+path))
			wantOriginal(t, first, a.status, a.body)
			wantReplay(t, first, x.do(post(path, orderJSON, "k"+path)))
			wantCalls(t, calls[path], 1)
		})
	}
}

func testNeverRecorded(t *testing.T, x *harness) {
	var n atomic.Int32
	allow := append(append([]string(nil), core.DefaultRecordedHeaders...), "Set-Cookie", "Authorization", "X-Ledger-Entry")
	x.start([]core.Option{core.WithRecordedHeaders(allow...)},
		Route{Method: "POST", Pattern: "/sessions", Handler: func(w http.ResponseWriter, r *http.Request) {
			i := n.Add(1)
			w.Header().Add("Set-Cookie", fmt.Sprintf("session=secret-%d; HttpOnly", i))
			w.Header().Set("Authorization", "Bearer secret")
			w.Header().Set("X-Ledger-Entry", "le_1")
			writeOrder(w, r, int(i))
		}})

	first := x.do(post("/sessions", orderJSON, "k1"))
	wantOriginal(t, first, http.StatusCreated, orderBody(1, "alice", orderJSON))
	if first.Header.Get("Set-Cookie") == "" {
		t.Fatal("the first client did not get its Set-Cookie")
	}
	got := x.do(post("/sessions", orderJSON, "k1"))
	wantReplay(t, first, got)
	for _, name := range []string{"Set-Cookie", "Authorization"} {
		if v, ok := got.Header[name]; ok {
			t.Errorf("replay carries %s: %q", name, v)
		}
	}
	if v := got.Header.Get("X-Ledger-Entry"); v != "le_1" {
		t.Errorf("replay X-Ledger-Entry %q, want le_1 (it is allowlisted)", v)
	}
	wantCalls(t, &n, 1)
}

func testAllowlist(t *testing.T, x *harness) {
	var n atomic.Int32
	x.start(nil, Route{Method: "POST", Pattern: "/orders", Handler: func(w http.ResponseWriter, r *http.Request) {
		i := n.Add(1)
		w.Header().Set("X-Request-Id", fmt.Sprintf("req-%d", i))
		w.Header().Set("Cache-Control", "private, max-age=60")
		writeOrder(w, r, int(i))
	}})

	first := x.do(post("/orders", orderJSON, "k1"))
	wantOriginal(t, first, http.StatusCreated, orderBody(1, "alice", orderJSON))
	if first.Header.Get("X-Request-Id") != "req-1" {
		t.Fatalf("the first client did not get X-Request-Id: %v", first.Header)
	}
	got := x.do(post("/orders", orderJSON, "k1"))
	wantReplay(t, first, got)
	for _, name := range []string{"X-Request-Id", "Cache-Control"} {
		if v, ok := got.Header[name]; ok {
			t.Errorf("replay carries %s: %q, which is not allowlisted", name, v)
		}
	}
	wantCalls(t, &n, 1)
}

func testKeyForms(t *testing.T, x *harness) {
	var n atomic.Int32
	x.start(nil, Route{Method: "POST", Pattern: "/orders", Handler: orderHandler(&n)})

	first := x.do(post("/orders", orderJSON, "8e03978e-40d5"))
	wantOriginal(t, first, http.StatusCreated, orderBody(1, "alice", orderJSON))
	for _, form := range []string{`"8e03978e-40d5"`, "  8e03978e-40d5\t", ` "8e03978e-40d5" `} {
		got := x.do(post("/orders", orderJSON, form))
		wantReplay(t, first, got)
		if t.Failed() {
			t.Fatalf("key form %q", form)
		}
	}
	wantCalls(t, &n, 1)

	// And the other way round: quoted first, raw second.
	first = x.do(post("/orders", orderJSON, `"k 2"`))
	wantOriginal(t, first, http.StatusCreated, orderBody(2, "alice", orderJSON))
	wantReplay(t, first, x.do(post("/orders", orderJSON, "k 2")))
	wantCalls(t, &n, 2)
}

func testLongestKey(t *testing.T, x *harness) {
	var n atomic.Int32
	x.start(nil, Route{Method: "POST", Pattern: "/orders", Handler: orderHandler(&n)})

	raw := strings.Repeat("r", core.MaxKeyLen)
	first := x.do(post("/orders", orderJSON, raw))
	wantOriginal(t, first, http.StatusCreated, orderBody(1, "alice", orderJSON))
	wantReplay(t, first, x.do(post("/orders", orderJSON, raw)))

	quoted := `"` + strings.Repeat("q", core.MaxKeyLen) + `"`
	first = x.do(post("/orders", orderJSON, quoted))
	wantOriginal(t, first, http.StatusCreated, orderBody(2, "alice", orderJSON))
	wantReplay(t, first, x.do(post("/orders", orderJSON, quoted)))
	wantCalls(t, &n, 2)
}

func testBadKeys(t *testing.T, x *harness) {
	var n atomic.Int32
	x.start(nil, Route{Method: "POST", Pattern: "/orders", Handler: orderHandler(&n)})

	cases := []struct {
		name   string
		values []string // nil: no header
		slug   string
	}{
		{"missing", nil, "missing-key"},
		{"empty", []string{""}, "invalid-key"},
		{"whitespace only", []string{" \t "}, "invalid-key"},
		{"empty quoted string", []string{`""`}, "invalid-key"},
		{"blank quoted string", []string{`"   "`}, "invalid-key"},
		{"256 bytes", []string{strings.Repeat("k", core.MaxKeyLen+1)}, "invalid-key"},
		{"256 bytes quoted", []string{`"` + strings.Repeat("k", core.MaxKeyLen+1) + `"`}, "invalid-key"},
		{"control character", []string{"abc\x01def"}, "invalid-key"},
		{"DEL character", []string{"abc\x7fdef"}, "invalid-key"},
		{"two header fields", []string{"abc", "abc"}, "invalid-key"},
		{"two fields joined by a comma", []string{"abc, def"}, "invalid-key"},
		{"unterminated quoted string", []string{`"abc`}, "invalid-key"},
		{"bad escape in quoted string", []string{`"a\qc"`}, "invalid-key"},
		{"quote inside quoted string", []string{`"a"c"`}, "invalid-key"},
		{"non-ASCII in quoted string", []string{"\"caf\u00e9\""}, "invalid-key"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			res := x.do(post("/orders", orderJSON, "").set(core.HeaderKey, c.values...))
			wantProblem(t, res, http.StatusBadRequest, c.slug)
		})
	}
	wantCalls(t, &n, 0)
}

func testKeyOptional(t *testing.T, x *harness) {
	var n atomic.Int32
	x.start(nil, Route{Method: "POST", Pattern: "/events", Options: []core.RouteOption{core.KeyOptional()}, Handler: orderHandler(&n)})

	for i := 1; i <= 2; i++ {
		wantOriginal(t, x.do(post("/events", orderJSON, "")), http.StatusCreated, orderBody(i, "alice", orderJSON))
	}
	first := x.do(post("/events", orderJSON, "k1"))
	wantOriginal(t, first, http.StatusCreated, orderBody(3, "alice", orderJSON))
	wantReplay(t, first, x.do(post("/events", orderJSON, "k1")))
	wantProblem(t, x.do(post("/events", orderJSON, `"unterminated`)), http.StatusBadRequest, "invalid-key")
	wantCalls(t, &n, 3)
}

func testMismatch(t *testing.T, x *harness) {
	var n atomic.Int32
	x.start(nil, Route{Method: "POST", Pattern: "/orders", Handler: orderHandler(&n)})

	first := x.do(post("/orders", orderJSON, "k1"))
	wantOriginal(t, first, http.StatusCreated, orderBody(1, "alice", orderJSON))
	for _, other := range []string{`{"amount":2000,"currency":"EUR"}`, `{"amount":1000}`, ""} {
		res := x.do(post("/orders", other, "k1"))
		wantProblem(t, res, http.StatusUnprocessableEntity, "key-reused")
		if res.replayed() {
			t.Errorf("a 422 carries %s", core.HeaderReplayed)
		}
	}
	// The record is unchanged: the first request still replays.
	wantReplay(t, first, x.do(post("/orders", orderJSON, "k1")))
	wantCalls(t, &n, 1)
}

func testCanonicalBody(t *testing.T, x *harness) {
	var n atomic.Int32
	x.start(nil, Route{Method: "POST", Pattern: "/orders", Handler: orderHandler(&n)})

	body := `{"amount":1,"currency":"EUR","items":[{"sku":"a","qty":2}]}`
	first := x.do(post("/orders", body, "k-json"))
	wantOriginal(t, first, http.StatusCreated, orderBody(1, "alice", body))
	for _, same := range []string{
		"{\n  \"amount\": 1,\n  \"currency\": \"EUR\",\n  \"items\": [ { \"sku\": \"a\", \"qty\": 2 } ]\n}\n",
		`{"items":[{"qty":2,"sku":"a"}],"currency":"EUR","amount":1}`,
		`{"amount":1,"currency":"\u0045UR","items":[{"sku":"\u0061","qty":2}]}`,
	} {
		got := x.do(post("/orders", same, "k-json"))
		wantReplay(t, first, got)
		if t.Failed() {
			t.Fatalf("body %q", same)
		}
	}

	form := func(body string) *request {
		return post("/orders", body, "k-form").set("Content-Type", "application/x-www-form-urlencoded")
	}
	firstForm := x.do(form("amount=1000&currency=EUR&note=a+b"))
	wantOriginal(t, firstForm, http.StatusCreated, orderBody(2, "alice", "amount=1000&currency=EUR&note=a+b"))
	wantReplay(t, firstForm, x.do(form("note=a%20b&currency=EUR&amount=1000")))
	wantCalls(t, &n, 2)
}

func testNoFingerprint(t *testing.T, x *harness) {
	var n, fps atomic.Int32
	fp := core.Fingerprint(func(r *http.Request, scope string, body []byte) ([]byte, error) {
		if fps.Add(1) == 1 {
			return nil, nil // the first request has no fingerprint
		}
		return core.DefaultFingerprint(r, scope, body)
	})
	x.start(nil, Route{Method: "POST", Pattern: "/orders", Options: []core.RouteOption{fp}, Handler: orderHandler(&n)})

	first := x.do(post("/orders", orderJSON, "k1"))
	wantOriginal(t, first, http.StatusCreated, orderBody(1, "alice", orderJSON))
	wantReplay(t, first, x.do(post("/orders", `{"amount":2000,"currency":"EUR"}`, "k1")))
	wantReplay(t, first, x.do(post("/orders", orderJSON, "k1")))
	wantCalls(t, &n, 1)
}
