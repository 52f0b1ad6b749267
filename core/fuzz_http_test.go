package core_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/memstore"
	"github.com/idemkit/idem/core/store"
)

// fuzzMaxBody is the request body cap of the fuzzed middleware: small, so
// that the fuzzer's inputs cross it often.
const fuzzMaxBody = 4096

// fuzzMode selects, bit by bit, how FuzzMiddleware builds its requests.
const (
	fzAtomic    = 1 << iota // memstore's atomic view instead of leased mode
	fzMethod1               // with fzMethod2: POST, PATCH, PUT (not covered), GET (not covered)
	fzMethod2               //
	fzTwice                 // send the same request a second time
	fzUnknownCL             // Content-Length unknown (-1) instead of the given one
	fzFields                // fingerprint a selection of fields, not the whole body
	fzOther                 // a different body under the same key (third request)
)

var fuzzMethods = [4]string{"POST", "PATCH", "PUT", "GET"}

// FuzzMiddleware drives the net/http middleware with arbitrary key header
// fields (zero, one or many; any bytes), arbitrary other header fields,
// content types, bodies (binary, invalid UTF-8, deeply nested JSON, larger
// than the cap) and declared lengths (possibly lying). Whatever it gets, the
// middleware must not panic, and must either run the handler exactly once
// and deliver its answer, or replay the recorded answer without running it,
// or answer with an RFC 9457 problem document; which one is decided here
// from the request alone (an oracle independent of the middleware's
// internals, except key syntax, which is ParseKey's).
func FuzzMiddleware(f *testing.F) {
	for _, s := range []struct {
		mode     uint8
		keys     string
		ctype    string
		body     []byte
		extra    string
		declared int64
	}{
		{0, "k1", "application/json", []byte(`{"amount":10}`), "", -1},
		{fzTwice, `"quoted-key"`, "application/json", []byte(`{"b":1,"a":[1,2.0]}`), "", 20},
		{fzTwice | fzAtomic, "k", "application/x-www-form-urlencoded", []byte("b=2&a=1&a=0"), "", -1},
		{fzTwice | fzOther, "k", "application/json", []byte(`{"a":1}`), "", -1},
		{0, "a\x1eb", "", []byte("x"), "", -1},            // two key fields
		{0, "", "application/json", []byte(`{}`), "", -1}, // no key
		{0, "\"unterminated", "", nil, "", -1},
		{0, "bad\x00key", "", nil, "", -1},
		{0, strings.Repeat("k", 256), "", nil, "", -1},
		{0, "k\xff\xfe", "text/plain", []byte("\xff\xfe\xfd invalid utf-8"), "", -1},
		{0, "k", "application/json", []byte(strings.Repeat("[", 5000)), "", -1}, // over the cap
		{fzTwice, "k", "application/json", []byte(strings.Repeat("[", 2000) + strings.Repeat("]", 2000)), "", -1},
		{fzTwice, "k", "application/json", []byte(strings.Repeat(`{"a":`, 600) + "1" + strings.Repeat("}", 600)), "", -1},
		{0, "k", "application/json", []byte(`{"a":1}`), "", 1 << 40}, // declared huge
		{fzTwice, "k", "application/json", nil, "", 7},               // declared, consumed upstream
		{fzTwice | fzUnknownCL, "k", "application/json", []byte(`{"a":1}`), "", 0},
		{fzTwice, "k", "application/json; charset=utf-8", []byte(`{"a":1e400,"b":12345678901234567890.5}`), "Idempotency-Key: other\nX-Caller: c2", -1},
		{fzTwice | fzFields, "k", "application/json", []byte(`{"amount":1,"note":"x"}`), "X-Caller: \xff", -1},
		{fzMethod1 | fzMethod2 | fzTwice, "k", "", []byte("get"), "", -1}, // not covered
		{fzMethod2 | fzTwice, "", "", nil, "", -1},                        // PUT, not covered, no key
		{fzTwice, "k", "multipart/form-data; boundary=x", []byte("--x\r\n\r\n--x--"), "Content-Encoding: gzip", -1},
	} {
		f.Add(s.mode, s.keys, s.ctype, s.body, s.extra, s.declared)
	}
	f.Fuzz(func(t *testing.T, mode uint8, keys, ctype string, body []byte, extra string, declared int64) {
		fuzzMiddlewareOnce(t, mode, keys, ctype, body, extra, declared)
	})
}

// fuzzRequest builds one request from the fuzzer's inputs.
func fuzzRequest(method, keys, ctype string, body []byte, extra string, declared int64) *http.Request {
	r := httptest.NewRequest(method, "/fuzz", nil)
	r.Body = io.NopCloser(bytes.NewReader(body))
	r.ContentLength = declared
	if declared < 0 {
		r.ContentLength = -1
	}
	if keys != "" {
		for _, k := range strings.Split(keys, "\x1e") { // one field per part
			r.Header.Add(core.HeaderKey, k)
		}
	}
	if ctype != "" {
		r.Header.Set("Content-Type", ctype)
	}
	for line := range strings.SplitSeq(extra, "\n") {
		name, value, ok := strings.Cut(line, ":")
		if !ok || name == "" {
			continue
		}
		r.Header.Add(name, strings.TrimLeft(value, " "))
	}
	return r
}

func fuzzMiddlewareOnce(t *testing.T, mode uint8, keys, ctype string, body []byte, extra string, declared int64) {
	var ran atomic.Int32
	var seen [][]byte // bodies the handler read, per run
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := ran.Add(1)
		b, err := io.ReadAll(r.Body)
		if err != nil {
			t.Errorf("the handler could not read the body: %v", err)
		}
		seen = append(seen, b)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"run":%d,"len":%d}`, n, len(b))
	})
	var store store.Store = memstore.New()
	if mode&fzAtomic != 0 {
		store = store.(*memstore.Store).Atomic()
	}
	opts := []core.Option{
		core.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))),
		core.WithMaxRequestBody(fuzzMaxBody),
		core.WithCaller(func(r *http.Request) (string, error) {
			if c := r.Header.Get("X-Caller"); c != "" {
				return c, nil
			}
			return "anonymous", nil
		}),
	}
	e, err := core.New(store, opts...)
	if err != nil {
		t.Fatal(err)
	}
	var ropts []core.RouteOption
	ropts = append(ropts, core.Scope("POST /fuzz"))
	if mode&fzFields != 0 {
		ropts = append(ropts, core.Fingerprint(core.FingerprintFields("amount")))
	}
	h := e.Handler(handler, ropts...)

	method := fuzzMethods[(mode>>1)&3]
	if mode&fzUnknownCL != 0 {
		declared = -1
	}
	send := func(b []byte) *httptest.ResponseRecorder {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, fuzzRequest(method, keys, ctype, b, extra, declared))
		return w
	}

	// The oracle: what the first request must get.
	covered := method == "POST" || method == "PATCH"
	fields := fuzzRequest(method, keys, ctype, nil, extra, -1).Header[core.HeaderKey]
	keyErr := ""
	switch {
	case len(fields) == 0:
		keyErr = "missing"
	case len(fields) > 1:
		keyErr = "repeated"
	default:
		k, err := core.ParseKey(fields[0])
		if err != nil {
			keyErr = err.Error()
		} else if len(k) == 0 || len(k) > core.MaxKeyLen || strings.ContainsFunc(k, func(r rune) bool { return r < 0x20 || r == 0x7f }) {
			t.Fatalf("ParseKey(%q) accepted %q: empty, too long or with control characters", fields[0], k)
		}
	}
	tooLarge := declared > fuzzMaxBody || len(body) > fuzzMaxBody
	// A declared body of which nothing is left to read was consumed before
	// the middleware: refused (500), never fingerprinted as empty.
	consumed := !tooLarge && declared > 0 && len(body) == 0

	w := send(body)
	switch {
	case !covered:
		wantHandler(t, w, &ran, 1, body, seen)
	case keyErr != "":
		wantProblem(t, w, http.StatusBadRequest, "invalid or missing key: "+keyErr)
	case tooLarge:
		wantProblem(t, w, http.StatusRequestEntityTooLarge, "body over the cap")
	case consumed:
		wantProblem(t, w, http.StatusInternalServerError, "body consumed upstream")
	default:
		wantHandler(t, w, &ran, 1, body, seen)
	}
	if ran.Load() == 0 && len(seen) != 0 {
		t.Fatal("the handler ran without being counted")
	}
	first := w

	if mode&fzTwice != 0 {
		w := send(body)
		switch {
		case !covered:
			wantHandler(t, w, &ran, 2, body, seen)
		case keyErr != "" || tooLarge || consumed:
			wantProblem(t, w, first.Code, "the same rejection again")
			if ran.Load() != 0 {
				t.Fatalf("nok, the handler ran for a rejected request")
			}
		default:
			if ran.Load() != 1 {
				t.Fatalf("nok, a duplicate ran the handler again (%d runs)", ran.Load())
			}
			if w.Code != first.Code || !bytes.Equal(w.Body.Bytes(), first.Body.Bytes()) || w.Header().Get(core.HeaderReplayed) != "true" {
				t.Fatalf("nok, a duplicate got %d %q (replayed=%q), want the replay of %d %q",
					w.Code, w.Body.Bytes(), w.Header().Get(core.HeaderReplayed), first.Code, first.Body.Bytes())
			}
		}
	}

	if mode&fzOther != 0 && covered && keyErr == "" && !tooLarge && !consumed && len(body) < fuzzMaxBody {
		// A different body under the same key: 422 unless the
		// fingerprints agree (same canonical JSON, same selected fields),
		// then a replay. Never a second run.
		other := append(bytes.Clone(body), ' ', '!')
		w := send(other)
		if ran.Load() != 1 {
			t.Fatalf("nok, a different body under a completed key ran the handler (%d runs)", ran.Load())
		}
		if w.Code == http.StatusUnprocessableEntity {
			wantProblem(t, w, http.StatusUnprocessableEntity, "key reused")
		} else if w.Code != first.Code || w.Header().Get(core.HeaderReplayed) != "true" {
			t.Fatalf("nok, a different body got %d, want 422 or the replay", w.Code)
		}
	}
}

// wantHandler checks that the handler ran (runs in all, so far) and that
// its answer was delivered, with the body it was sent.
func wantHandler(t *testing.T, w *httptest.ResponseRecorder, ran *atomic.Int32, runs int32, body []byte, seen [][]byte) {
	t.Helper()
	if got := ran.Load(); got != runs {
		t.Fatalf("nok, the handler ran %d times, want %d (answer %d %q)", got, runs, w.Code, w.Body.Bytes())
	}
	if w.Code != http.StatusCreated {
		t.Fatalf("nok, got %d %q, want the handler's 201", w.Code, w.Body.Bytes())
	}
	if w.Header().Get(core.HeaderReplayed) != "" {
		t.Fatal("nok, a first execution is marked replayed")
	}
	if got := seen[len(seen)-1]; !bytes.Equal(got, body) {
		t.Fatalf("nok, the handler read %d bytes, the client sent %d", len(got), len(body))
	}
}

// wantProblem checks that w is an RFC 9457 problem document with status.
func wantProblem(t *testing.T, w *httptest.ResponseRecorder, status int, why string) {
	t.Helper()
	if w.Code != status {
		t.Fatalf("nok (%s): status %d %q, want %d", why, w.Code, w.Body.Bytes(), status)
	}
	checkProblemDoc(t, w.Code, w.Header(), w.Body.Bytes())
}

// checkProblemDoc checks an RFC 9457 problem document: the media type,
// Cache-Control: no-store, valid JSON with type, title and the status.
func checkProblemDoc(t *testing.T, code int, h http.Header, body []byte) {
	t.Helper()
	if ct := h.Get("Content-Type"); ct != "application/problem+json" {
		t.Fatalf("nok, a rejection with Content-Type %q", ct)
	}
	if cc := h.Get("Cache-Control"); cc != "no-store" {
		t.Fatalf("nok, a rejection with Cache-Control %q", cc)
	}
	var p struct {
		Type   *string `json:"type"`
		Title  *string `json:"title"`
		Status *int    `json:"status"`
	}
	if !json.Valid(body) {
		t.Fatalf("nok, a problem document that is not JSON: %q", body)
	}
	if err := json.Unmarshal(body, &p); err != nil {
		t.Fatalf("nok, problem document %q: %v", body, err)
	}
	if p.Type == nil || *p.Type == "" || p.Title == nil || *p.Title == "" || p.Status == nil || *p.Status != code {
		t.Fatalf("nok, problem document %q lacks type/title or disagrees with status %d", body, code)
	}
}

// countingBody is a request body of n bytes of '[' that counts what is read.
type countingBody struct {
	left int64
	read atomic.Int64
}

func (b *countingBody) Read(p []byte) (int, error) {
	if b.left == 0 {
		return 0, io.EOF
	}
	n := int64(len(p))
	n = min(n, b.left)
	for i := range p[:n] {
		p[i] = '['
	}
	b.left -= n
	b.read.Add(n)
	return int(n), nil
}

func (b *countingBody) Close() error { return nil }

// TestMiddlewareHugeBodyIsRefusedWithinTheCap sends a 10 MB body to a
// route with the default cap (DefaultMaxRequestBody): it is refused with 413
// before the handler runs, having read and allocated no more than the cap
// and a small margin, whether or not the body's length is declared.
func TestMiddlewareHugeBodyIsRefusedWithinTheCap(t *testing.T) {
	const size = 10 << 20
	const limit = core.DefaultMaxRequestBody
	e, err := core.New(memstore.New(), core.WithSingleCaller(),
		core.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
	if err != nil {
		t.Fatal(err)
	}
	var ran atomic.Int32
	h := e.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { ran.Add(1) }), core.Scope("huge"))
	for _, tc := range []struct {
		name     string
		declared int64
		maxRead  int64
	}{
		{"ok, a declared length over the cap is refused before reading", size, 0},
		// The margin: one read past the cap. Reading the whole body, or a
		// fraction of it proportional to the cap, would fail.
		{"ok, an undeclared length is refused once the cap is passed", -1, limit + 64<<10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for i := range 3 { // warm the buffer pool, then measure
				body := &countingBody{left: size}
				r := httptest.NewRequest("POST", "/huge", nil)
				r.Body, r.ContentLength = body, tc.declared
				r.Header.Set(core.HeaderKey, fmt.Sprintf("huge-%d", i))
				w := httptest.NewRecorder()
				var before, after runtime.MemStats
				runtime.GC()
				runtime.ReadMemStats(&before)
				h.ServeHTTP(w, r)
				runtime.ReadMemStats(&after)
				wantProblem(t, w, http.StatusRequestEntityTooLarge, "10 MB body")
				if got := body.read.Load(); got > tc.maxRead {
					t.Errorf("nok, read %d bytes of a 10 MB body to refuse it; the cap is %d (allowed up to %d)", got, limit, tc.maxRead)
				}
				// Bounded by a multiple of the cap, not of the body. (The
				// buffer grows by append from 4 KiB, which allocates about
				// 5x the cap in all: see the report of issue 7.)
				if alloc := after.TotalAlloc - before.TotalAlloc; i > 0 && alloc > 8*limit {
					t.Errorf("nok, refusing a 10 MB body allocated %d bytes (cap %d)", alloc, limit)
				}
			}
			if ran.Load() != 0 {
				t.Fatal("nok, the handler ran for a body over the cap")
			}
		})
	}
}

// TestMiddlewareDeeplyNestedJSON sends JSON nested far deeper than
// canonjson.MaxDepth (a million '[' and a hundred thousand objects) within the
// body cap: the fingerprint falls back to the raw bytes without exhausting
// the stack or the heap, the handler runs once with the exact body, a
// duplicate replays, and a different deep body under the same key is 422.
func TestMiddlewareDeeplyNestedJSON(t *testing.T) {
	for _, tc := range []struct {
		name string
		body string
	}{
		{"ok, 1e6 unclosed '['", strings.Repeat("[", 1_000_000)},
		{"ok, 5e5 balanced '[' ']'", strings.Repeat("[", 500_000) + strings.Repeat("]", 500_000)},
		{"ok, 1e5 nested objects", strings.Repeat(`{"a":`, 100_000) + "1" + strings.Repeat("}", 100_000)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, err := core.New(memstore.New(), core.WithSingleCaller(), core.WithMaxRequestBody(2<<20),
				core.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
			if err != nil {
				t.Fatal(err)
			}
			var ran atomic.Int32
			var seen [][]byte
			h := e.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				n := ran.Add(1)
				b, _ := io.ReadAll(r.Body)
				seen = append(seen, b)
				w.WriteHeader(http.StatusCreated)
				fmt.Fprintf(w, "run %d", n)
			}), core.Scope("deep"))
			send := func(body string) *httptest.ResponseRecorder {
				r := httptest.NewRequest("POST", "/deep", strings.NewReader(body))
				r.Header.Set("Content-Type", "application/json")
				r.Header.Set(core.HeaderKey, "deep")
				w := httptest.NewRecorder()
				h.ServeHTTP(w, r)
				return w
			}
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			w := send(tc.body)
			runtime.ReadMemStats(&after)
			wantHandler(t, w, &ran, 1, []byte(tc.body), seen)
			// The body is read once into a buffer (grown by append: about
			// 5x its size allocated in all) and recorded nowhere else; the
			// canonicaliser gives up at canonjson.MaxDepth without allocating.
			if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 8*(2<<20) {
				t.Errorf("nok, a %d-byte deep document allocated %d bytes (cap 2 MiB)", len(tc.body), alloc)
			}
			if w := send(tc.body); w.Code != http.StatusCreated || w.Header().Get(core.HeaderReplayed) != "true" || ran.Load() != 1 {
				t.Fatalf("nok, duplicate: %d replayed=%q runs=%d", w.Code, w.Header().Get(core.HeaderReplayed), ran.Load())
			}
			if w := send(tc.body[:len(tc.body)-1] + "0"); w.Code != http.StatusUnprocessableEntity || ran.Load() != 1 {
				t.Fatalf("nok, a different deep body: %d, runs=%d; want 422", w.Code, ran.Load())
			}
		})
	}
}
