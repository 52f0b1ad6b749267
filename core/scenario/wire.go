package scenario

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/idemkit/idem/core"
)

// Scenarios of the wire form: what makes two requests that a handler
// reads differently two requests (numbers as written, the Content-Type
// with its parameters), and response headers in the handler's spelling.

func testNumbersByText(t *testing.T, x *harness) {
	var n atomic.Int32
	x.start(nil, Route{Method: "POST", Pattern: "/orders", Handler: orderHandler(&n)})

	// An int64 field refuses 1e3 and accepts 1000: the corrected request
	// is another request, never the first one's answer.
	sci := `{"amount":1e3,"currency":"EUR"}`
	first := x.do(post("/orders", sci, "k-sci"))
	wantOriginal(t, first, http.StatusCreated, orderBody(1, "alice", sci))
	wantMismatch(t, x.do(post("/orders", `{"amount":1000,"currency":"EUR"}`, "k-sci")), "1000 after 1e3")
	wantReplay(t, first, x.do(post("/orders", "{ \"currency\": \"EUR\",\n  \"amount\": 1e3 }", "k-sci")))

	// 1, 1.0, 1e0 and 1.00: four requests; each replays only itself.
	spellings := []string{"1", "1.0", "1e0", "1.00"}
	for i, a := range spellings {
		key := "k-" + a
		body := `{"amount":` + a + `,"currency":"EUR"}`
		res := x.do(post("/orders", body, key))
		wantOriginal(t, res, http.StatusCreated, orderBody(2+i, "alice", body))
		for _, b := range spellings {
			if b != a {
				wantMismatch(t, x.do(post("/orders", `{"amount":`+b+`,"currency":"EUR"}`, key)), b+" after "+a)
			}
		}
		wantReplay(t, res, x.do(post("/orders", `{"currency":"EUR", "amount":`+a+`}`, key)))
	}
	wantCalls(t, &n, 1+len(spellings))
}

// multipartAmount is one multipart body that says amount=999999 to a
// reader of boundary "y" (its first part; the rest is the epilogue) and
// amount=100 to a reader of boundary "x" (the "y" part is its preamble).
const multipartAmount = "--y\r\nContent-Disposition: form-data; name=\"amount\"\r\n\r\n999999\r\n--y--\r\n" +
	"--x\r\nContent-Disposition: form-data; name=\"amount\"\r\n\r\n100\r\n--x--\r\n"

// amountHandler answers 201 with the amount field of the form it reads
// (multipart or urlencoded).
func amountHandler(n *atomic.Int32) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		i := n.Add(1)
		if err := r.ParseMultipartForm(1 << 20); err != nil && err != http.ErrNotMultipart {
			http.Error(w, "reading the form: "+err.Error(), http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"charge":%d,"amount":%q}`, i, r.FormValue("amount"))
	}
}

func testContentType(t *testing.T, x *harness) {
	var n atomic.Int32
	x.start(nil,
		Route{Method: "POST", Pattern: "/charges", Handler: amountHandler(&n)},
		Route{Method: "POST", Pattern: "/orders", Handler: orderHandler(&n)},
	)
	multipart := func(boundary, key string) *request {
		return post("/charges", multipartAmount, key).set("Content-Type", "multipart/form-data; boundary="+boundary)
	}

	first := x.do(multipart("x", "k-mp"))
	wantOriginal(t, first, http.StatusCreated, `{"charge":1,"amount":"100"}`)
	wantMismatch(t, x.do(multipart("y", "k-mp")), "the same multipart body under another boundary")
	wantReplay(t, first, x.do(multipart("x", "k-mp")))
	// What the second would have charged, under a key of its own.
	wantOriginal(t, x.do(multipart("y", "k-mp-2")), http.StatusCreated, `{"charge":2,"amount":"999999"}`)

	// The charset is read too.
	text := func(charset string) *request {
		return post("/orders", "caf\xe9", "k-text").set("Content-Type", "text/plain; charset="+charset)
	}
	latin := x.do(text("iso-8859-1"))
	wantOriginal(t, latin, http.StatusCreated, orderBody(3, "alice", "caf\xe9"))
	wantMismatch(t, x.do(text("utf-8")), "the same bytes in another charset")
	wantReplay(t, latin, x.do(text("iso-8859-1")))

	// A request without a body reads no Content-Type: declaring one or not
	// is the same request.
	bare := x.do(post("/orders", "", "k-none"))
	wantOriginal(t, bare, http.StatusCreated, orderBody(4, "alice", ""))
	wantReplay(t, bare, x.do(post("/orders", "", "k-none").set("Content-Type", "application/json")))
	wantCalls(t, &n, 4)
}

// headerValues returns the values of every key of h that names name
// (header names are case-insensitive), in the order of the keys' spelling.
func headerValues(h http.Header, name string) []string {
	var keys []string
	for k := range h {
		if strings.EqualFold(k, name) {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	var vs []string
	for _, k := range keys {
		vs = append(vs, h[k]...)
	}
	return vs
}

func testHeaderSpelling(t *testing.T, x *harness) {
	var n atomic.Int32
	allow := append(append([]string(nil), core.DefaultRecordedHeaders...), "Set-Cookie")
	x.start([]core.Option{core.WithRecordedHeaders(allow...)},
		Route{Method: "POST", Pattern: "/orders", Handler: func(w http.ResponseWriter, r *http.Request) {
			i := n.Add(1)
			// Go's documented way to send a name in a spelling of one's
			// own: assign to the map.
			h := w.Header()
			h["ETag"] = []string{fmt.Sprintf(`"v%d"`, i)}
			h["content-language"] = []string{"en", "fr"}
			h["set-cookie"] = []string{fmt.Sprintf("session=secret-%d", i)}
			h["x-request-id"] = []string{fmt.Sprintf("req-%d", i)}
			writeOrder(w, r, int(i))
		}})

	first := x.do(post("/orders", orderJSON, "k1"))
	wantOriginal(t, first, http.StatusCreated, orderBody(1, "alice", orderJSON))
	want := map[string][]string{"ETag": {`"v1"`}, "Content-Language": {"en", "fr"}}
	for name, vs := range want {
		if got := headerValues(first.Header, name); !slices.Equal(got, vs) {
			t.Fatalf("the first answer's %s: %q, want %q", name, got, vs)
		}
	}
	got := x.do(post("/orders", orderJSON, "k1"))
	wantReplay(t, first, got)
	for name, vs := range want {
		if v := headerValues(got.Header, name); !slices.Equal(v, vs) {
			t.Errorf("replay %s: %q, want %q (allowlisted, set by the handler under its own spelling)", name, v, vs)
		}
	}
	// Under the spelling the first client got.
	for _, k := range []string{"ETag", "content-language"} {
		if _, ok := first.Header[k]; ok && !slices.Equal(got.Header[k], first.Header[k]) {
			t.Errorf("replay %q: %q, want %q as the first answer spelt it", k, got.Header[k], first.Header[k])
		}
	}
	for _, name := range []string{"Set-Cookie", "X-Request-Id"} {
		if v := headerValues(got.Header, name); len(v) > 0 {
			t.Errorf("replay carries %s: %q (never recorded, or not allowlisted)", name, v)
		}
	}
	wantCalls(t, &n, 1)
}
