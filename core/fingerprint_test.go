package core

import (
	"github.com/idemkit/idem/internal/canonjson"

	"github.com/idemkit/idem/internal/jsontest"

	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"testing"
)

func newRequest(contentType string) *http.Request {
	r := httptest.NewRequest(http.MethodPost, "/orders/1", nil)
	if contentType != "" {
		r.Header.Set("Content-Type", contentType)
	}
	return r
}

func fp(t *testing.T, f Fingerprinter, contentType, scope, body string) []byte {
	t.Helper()
	got, err := f(newRequest(contentType), scope, []byte(body))
	if err != nil {
		t.Fatalf("fingerprint: %v", err)
	}
	if len(got) != sha256.Size {
		t.Fatalf("fingerprint has %d bytes, want %d", len(got), sha256.Size)
	}
	return got
}

// wantFingerprint builds the documented preimage of a request from
// newRequest (POST /orders/1, no query) by hand.
func wantFingerprint(scope, contentType string, kind byte, form string) []byte {
	var cts []string
	if contentType != "" {
		cts = []string{contentType}
	}
	return preimageHash(scope, "POST", "/orders/1", "", 'q', "", cts, kind, form)
}

// preimageHash builds the documented preimage by hand and hashes it; cts
// are the Content-Type field values (left out for an empty body).
func preimageHash(scope, method, path, rawPath string, qkind byte, query string, cts []string, kind byte, form string) []byte {
	part := func(p []byte, s string) []byte {
		p = binary.BigEndian.AppendUint64(p, uint64(len(s)))
		return append(p, s...)
	}
	p := []byte("idem/fp/v2\n")
	p = part(p, scope)
	p = part(p, method)
	p = part(p, path)
	p = part(p, rawPath)
	p = append(p, qkind)
	p = part(p, query)
	if kind != 'e' {
		p = binary.BigEndian.AppendUint64(p, uint64(len(cts)))
		for _, ct := range cts {
			p = part(p, ct)
		}
	}
	p = append(p, kind)
	p = append(p, form...)
	sum := sha256.Sum256(p)
	return sum[:]
}

func TestDefaultFingerprintFormat(t *testing.T) {
	const scope = "POST /orders/:id"
	for _, tt := range []struct {
		name, contentType, body string
		kind                    byte
		form                    string
	}{
		{"ok, JSON hashed in canonical form", "application/json", `{ "b": 1.0, "a": "\u00e9" }`, 'j', `{"a":"é","b":1.0}`},
		{"ok, JSON with parameters", "application/json; charset=UTF-8", `{"a":1e3}`, 'j', `{"a":1e3}`},
		{"ok, invalid JSON hashed raw", "application/json", `{"b":1,}`, 'r', `{"b":1,}`},
		{"ok, form hashed in canonical form", "application/x-www-form-urlencoded", "b=2&a=x+y&a=%7e", 'f', "a=x+y&a=~&b=2"},
		{"ok, text hashed raw", "text/plain", "hello", 'r', "hello"},
		{"ok, no type hashed raw", "", "hello", 'r', "hello"},
		{"ok, +json without a subtype hashed raw", "application/+json", ` {"a":1}`, 'r', ` {"a":1}`},
		{"ok, content type as sent", "Multipart/Form-Data;boundary=\"AbC\"", "--AbC--", 'r', "--AbC--"},
		{"ok, empty body", "application/json", "", 'e', ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got := fp(t, DefaultFingerprint, tt.contentType, scope, tt.body)
			if want := wantFingerprint(scope, tt.contentType, tt.kind, tt.form); !bytes.Equal(got, want) {
				t.Fatalf("got %x, want %x", got, want)
			}
		})
	}
	// The format is persisted in stores: changing it turns every retry
	// across an upgrade into a mismatch. This pins it.
	got := fp(t, DefaultFingerprint, "application/json", "POST /orders", `{"amount":1.50,"currency":"eur"}`)
	if want := "a2e3b010"; fmt.Sprintf("%x", got)[:8] != want {
		t.Fatalf("fingerprint format changed: got %x, want prefix %s", got, want)
	}
}

func TestDefaultFingerprint(t *testing.T) {
	const scope = "POST /orders/:id"
	const json1 = `{"amount":1000,"currency":"eur","items":[{"sku":"a","qty":1},{"sku":"b","qty":2}]}`
	const json2 = "{\n  \"items\": [ {\"qty\": 1, \"sku\": \"a\"}, {\"qty\": 2, \"sku\": \"\\u0062\"} ],\n  \"currency\": \"eur\",\n  \"amount\": 1000\n}"
	same := []struct {
		name                   string
		ctA, bodyA, ctB, bodyB string
		scopeB                 string
	}{
		{"ok, reformatted JSON agrees", "application/json", json1, "application/json", json2, ""},
		{"ok, media type read case-insensitively", "Application/JSON", json1, "Application/JSON", json2, ""},
		{"ok, parameters do not stop JSON", "application/json; charset=utf-8", json1, "application/json; charset=utf-8", json2, ""},
		{"ok, +json suffix is JSON", "application/vnd.api+json", json1, "application/vnd.api+json", json2, ""},
		{"ok, merge-patch+json is JSON", "application/merge-patch+json; charset=UTF-8", json1, "application/merge-patch+json; charset=UTF-8", json2, ""},
		{"ok, bad parameter still JSON", "application/json; charset", json1, "application/json; charset", json2, ""},
		{"ok, form fields reordered agree", "application/x-www-form-urlencoded", "a=1&b=2&c=3", "application/x-www-form-urlencoded", "c=3&a=1&b=2", ""},
		{"ok, form escapes agree", "application/x-www-form-urlencoded; charset=utf-8", "name=J%C3%B6rg+M&x=%2F", "application/x-www-form-urlencoded; charset=utf-8", "x=/&name=J%c3%b6rg%20M", ""},
		{"ok, empty bodies agree across types", "application/json", "", "text/plain", "", ""},
		{"ok, same raw text", "text/plain", "hello", "text/plain", "hello", ""},
		{"ok, empty bodies agree with and without a type", "application/json", "", "", "", ""},
	}
	for _, tt := range same {
		t.Run(tt.name, func(t *testing.T) {
			scopeB := scope
			if tt.scopeB != "" {
				scopeB = tt.scopeB
			}
			a := fp(t, DefaultFingerprint, tt.ctA, scope, tt.bodyA)
			b := fp(t, DefaultFingerprint, tt.ctB, scopeB, tt.bodyB)
			if !bytes.Equal(a, b) {
				t.Fatalf("fingerprints differ: %x vs %x", a, b)
			}
		})
	}
	differ := []struct {
		name                   string
		ctA, bodyA, ctB, bodyB string
		scopeB                 string
	}{
		{"nok, different scope", "application/json", json1, "application/json", json1, "POST /refunds/:id"},
		{"nok, scope and body do not run together", "text/plain", "ab", "text/plain", "b", scope + "a"},
		{"nok, different JSON value", "application/json", `{"amount":1000}`, "application/json", `{"amount":1000.5}`, ""},
		{"nok, 1e3 is not 1000", "application/json", `{"amount":1000}`, "application/json", `{"amount":1e3}`, ""},
		{"nok, 1 is not 1.0", "application/json", `{"amount":1}`, "application/json", `{"amount":1.0}`, ""},
		{"nok, 1.0 is not 1e0", "application/json", `{"amount":1.0}`, "application/json", `{"amount":1e0}`, ""},
		{"nok, 1e0 is not 1.00", "application/json", `{"amount":1e0}`, "application/json", `{"amount":1.00}`, ""},
		{"nok, charset parameter counts", "application/json", json1, "application/json; charset=utf-8", json1, ""},
		{"nok, media type case counts", "application/json", json1, "Application/JSON", json1, ""},
		{"nok, no content type is not text", "text/plain", "hello", "", "hello", ""},
		{"nok, invalid JSON raw, but not text", "application/json", "{nope", "text/plain", "{nope", ""},
		{"nok, 12345678901234567890.5 vs neighbour", "application/json", `{"n":12345678901234567890.5}`, "application/json", `{"n":12345678901234567891}`, ""},
		{"nok, JSON reformatted but sent as text", "text/plain", json1, "text/plain", json2, ""},
		{"nok, invalid JSON differs from canonical of anything", "application/json", `{"a":1}`, "application/json", `{"a":1`, ""},
		{"nok, raw bytes equal to a canonical form differ from it", "application/json", `{"a":1}`, "application/octet-stream", `{"a":1}`, ""},
		{"nok, duplicate keys hashed raw", "application/json", `{"a":1}`, "application/json", `{"a":1,"a":1}`, ""},
		{"nok, form repeated values order matters", "application/x-www-form-urlencoded", "a=1&a=2", "application/x-www-form-urlencoded", "a=2&a=1", ""},
		{"nok, form vs same text", "application/x-www-form-urlencoded", "a=1&b=2", "text/plain", "a=1&b=2", ""},
		{"nok, invalid form hashed raw", "application/x-www-form-urlencoded", "a=1&b=2", "application/x-www-form-urlencoded", "b=2&a=1;c=3", ""},
		{"nok, multipart is raw", "multipart/form-data; boundary=x", "--x\r\nA\r\n--x--", "multipart/form-data; boundary=x", "--x\r\nB\r\n--x--", ""},
		{"nok, +json needs a subtype", "application/json", `{"a":1}`, "application/+json", ` {"a":1}`, ""},
		{"nok, empty body vs empty JSON string", "application/json", "", "application/json", `""`, ""},
	}
	for _, tt := range differ {
		t.Run(tt.name, func(t *testing.T) {
			scopeB := scope
			if tt.scopeB != "" {
				scopeB = tt.scopeB
			}
			a := fp(t, DefaultFingerprint, tt.ctA, scope, tt.bodyA)
			b := fp(t, DefaultFingerprint, tt.ctB, scopeB, tt.bodyB)
			if bytes.Equal(a, b) {
				t.Fatalf("fingerprints agree: %x", a)
			}
		})
	}
}

// TestFingerprintContentType: the Content-Type, parameters included, is
// part of the fingerprint whenever there is a body (a multipart boundary
// or a charset changes what the handler reads), byte for byte as sent;
// a request without a body has one fingerprint whatever its Content-Type.
func TestFingerprintContentType(t *testing.T) {
	const scope = "POST /orders"
	multipart := func(boundary string) string {
		return "--" + boundary + "\r\nContent-Disposition: form-data; name=\"amount\"\r\n\r\n100\r\n--" + boundary + "--\r\n"
	}
	// One body, read under two boundaries: amount=100 under "x" (the "y"
	// part is its preamble), amount=999999 under "y".
	body := "--y\r\nContent-Disposition: form-data; name=\"amount\"\r\n\r\n999999\r\n--y--\r\n" +
		"--x\r\nContent-Disposition: form-data; name=\"amount\"\r\n\r\n100\r\n--x--\r\n"
	at := func(f Fingerprinter, body string, cts ...string) []byte {
		t.Helper()
		r := httptest.NewRequest(http.MethodPost, "/orders", nil)
		for _, ct := range cts {
			r.Header.Add("Content-Type", ct)
		}
		got, err := f(r, scope, []byte(body))
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	for _, f := range []struct {
		name string
		fp   Fingerprinter
	}{{"DefaultFingerprint", DefaultFingerprint}, {"FingerprintFields", FingerprintFields("amount")}} {
		t.Run(f.name, func(t *testing.T) {
			differ := []struct {
				name         string
				bodyA, bodyB string
				ctA, ctB     []string
			}{
				{"nok, one multipart body under two boundaries", body, body, []string{"multipart/form-data; boundary=x"}, []string{"multipart/form-data; boundary=y"}},
				{"nok, boundaries differ in case only", multipart("AbC"), multipart("AbC"), []string{"multipart/form-data; boundary=AbC"}, []string{"multipart/form-data; boundary=abc"}},
				{"nok, a charset and none", `{"amount":1}`, `{"amount":1}`, []string{"application/json"}, []string{"application/json; charset=utf-8"}},
				{"nok, two charsets", "caf\xe9", "caf\xe9", []string{"text/plain; charset=iso-8859-1"}, []string{"text/plain; charset=utf-8"}},
				{"nok, charset in another case", `{"amount":1}`, `{"amount":1}`, []string{"application/json; charset=utf-8"}, []string{"application/json; charset=UTF-8"}},
				{"nok, media type in another case", `{"amount":1}`, `{"amount":1}`, []string{"application/json"}, []string{"Application/JSON"}},
				{"nok, parameters in another order", "a", "a", []string{"text/plain; a=1; b=2"}, []string{"text/plain; b=2; a=1"}},
				{"nok, a quoted and a bare parameter", "a", "a", []string{`text/plain; a="1"`}, []string{"text/plain; a=1"}},
				{"nok, no type and an empty one", "a", "a", nil, []string{""}},
				{"nok, one field and two", "a", "a", []string{"text/plain"}, []string{"text/plain", "text/plain"}},
				{"nok, two fields swapped", "a", "a", []string{"text/plain", "text/html"}, []string{"text/html", "text/plain"}},
				{"nok, type and body do not run together", "xa", "a", []string{"text/plain"}, []string{"text/plainx"}},
			}
			for _, tt := range differ {
				t.Run(tt.name, func(t *testing.T) {
					if a, b := at(f.fp, tt.bodyA, tt.ctA...), at(f.fp, tt.bodyB, tt.ctB...); bytes.Equal(a, b) {
						t.Fatalf("%q and %q: fingerprints agree", tt.ctA, tt.ctB)
					}
				})
			}
			same := []struct {
				name     string
				ctA, ctB []string
			}{
				{"ok, no body: no type and JSON agree", nil, []string{"application/json"}},
				{"ok, no body: two boundaries agree", []string{"multipart/form-data; boundary=x"}, []string{"multipart/form-data; boundary=y"}},
				{"ok, no body: two fields and none agree", []string{"text/plain", "text/html"}, nil},
			}
			for _, tt := range same {
				t.Run(tt.name, func(t *testing.T) {
					if a, b := at(f.fp, "", tt.ctA...), at(f.fp, "", tt.ctB...); !bytes.Equal(a, b) {
						t.Fatalf("%q and %q without a body: fingerprints differ", tt.ctA, tt.ctB)
					}
				})
			}
		})
	}
	t.Run("ok, the preimage of a body-less request is the one v2 always had", func(t *testing.T) {
		got := at(DefaultFingerprint, "", "application/json; charset=utf-8")
		if want := preimageHash(scope, "POST", "/orders", "", 'q', "", nil, 'e', ""); !bytes.Equal(got, want) {
			t.Fatalf("got %x, want %x", got, want)
		}
	})
}

func TestDefaultFingerprintNilRequest(t *testing.T) {
	got, err := DefaultFingerprint(nil, "s", []byte("x"))
	if err != nil || !bytes.Equal(got, preimageHash("s", "", "", "", 'q', "", nil, 'r', "x")) {
		t.Fatalf("got %x, %v", got, err)
	}
}

func TestDefaultFingerprintDoesNotRetainBody(t *testing.T) {
	body := []byte(`{"b":{"d":1,"c":2},"a":"secret"}`)
	orig := append([]byte(nil), body...)
	r := newRequest("application/json")
	first, _ := DefaultFingerprint(r, "s", body)
	for i := range body {
		body[i] = 'x'
	}
	// Run again on other bodies, so a pooled buffer would be reused.
	for range 10 {
		_, _ = DefaultFingerprint(r, "s", []byte(`{"z":[1,2,3],"y":{"b":1,"a":2}}`))
	}
	again, _ := DefaultFingerprint(r, "s", orig)
	if !bytes.Equal(first, again) {
		t.Fatalf("fingerprint changed: %x vs %x", first, again)
	}
	c, _ := canonjson.Append(nil, orig)
	if len(c) > 0 && &c[0] == &orig[0] {
		t.Fatal("canonjson.Append output aliases its input")
	}
}

func TestFingerprintFields(t *testing.T) {
	const scope = "POST /payments"
	f := FingerprintFields("amount", "currency")
	same := []struct{ name, ct, a, b string }{
		{"ok, other fields ignored", "application/json", `{"amount":100,"currency":"eur","note":"x"}`, `{"currency":"eur","amount":100,"note":"y","extra":[1]}`},
		{"ok, selected values canonical", "application/json", `{"amount":100,"currency":"eur"}`, `{ "currency":"\u0065ur", "amount":100}`},
		{"ok, nested selected value canonical", "application/json", `{"amount":{"b":1,"a":2.0}}`, `{"amount":{"a":2.0,"b":1}}`},
		{"ok, form other fields ignored", "application/x-www-form-urlencoded", "amount=100&currency=eur&note=x", "note=y&currency=eur&amount=100"},
		{"ok, same as default on selected fields", "application/json", `{"amount":100,"currency":"eur"}`, `{"amount":100,"currency":"eur","x":1}`},
	}
	for _, tt := range same {
		t.Run(tt.name, func(t *testing.T) {
			a, b := fp(t, f, tt.ct, scope, tt.a), fp(t, f, tt.ct, scope, tt.b)
			if !bytes.Equal(a, b) {
				t.Fatalf("fingerprints differ: %x vs %x", a, b)
			}
		})
	}
	t.Run("ok, equals DefaultFingerprint of the narrowed body", func(t *testing.T) {
		a := fp(t, f, "application/json", scope, `{"note":1,"currency":"eur","amount":100}`)
		b := fp(t, DefaultFingerprint, "application/json", scope, `{"amount":100,"currency":"eur"}`)
		if !bytes.Equal(a, b) {
			t.Fatalf("fingerprints differ: %x vs %x", a, b)
		}
	})
	differ := []struct{ name, ct, a, b string }{
		{"nok, selected field differs", "application/json", `{"amount":100,"currency":"eur"}`, `{"amount":101,"currency":"eur"}`},
		{"nok, selected number spelt otherwise", "application/json", `{"amount":100,"currency":"eur"}`, `{"amount":1e2,"currency":"eur"}`},
		{"nok, missing field differs from null", "application/json", `{"amount":100}`, `{"amount":100,"currency":null}`},
		{"nok, form selected field differs", "application/x-www-form-urlencoded", "amount=100&note=x", "amount=200&note=x"},
		{"nok, top-level array hashed raw", "application/json", `[1, 2]`, `[1,2]`},
		{"nok, invalid JSON hashed raw", "application/json", `{"amount":100,}`, `{"amount":100 ,}`},
		{"nok, text hashed raw", "text/plain", `amount=1`, `amount=1 `},
	}
	for _, tt := range differ {
		t.Run(tt.name, func(t *testing.T) {
			a, b := fp(t, f, tt.ct, scope, tt.a), fp(t, f, tt.ct, scope, tt.b)
			if bytes.Equal(a, b) {
				t.Fatalf("fingerprints agree: %x", a)
			}
		})
	}
	t.Run("ok, no fields: every object agrees", func(t *testing.T) {
		none := FingerprintFields()
		a := fp(t, none, "application/json", scope, `{"a":1}`)
		b := fp(t, none, "application/json", scope, `{"b":2}`)
		if !bytes.Equal(a, b) {
			t.Fatalf("fingerprints differ: %x vs %x", a, b)
		}
	})
	t.Run("ok, top-level array falls back like DefaultFingerprint", func(t *testing.T) {
		a := fp(t, f, "application/json", scope, `[1]`)
		if want := wantFingerprint(scope, "application/json", 'r', `[1]`); !bytes.Equal(a, want) {
			t.Fatalf("got %x, want %x", a, want)
		}
	})
}

const benchBody = `{
  "customer_id": "cus_9s6XKzkNRiz8i3",
  "amount": 2500,
  "currency": "eur",
  "description": "Order #1042 \u2013 2 items",
  "metadata": {"order_id": "1042", "channel": "web"},
  "items": [
    {"sku": "SKU-123", "quantity": 1, "price": 1250.00},
    {"sku": "SKU-456", "quantity": 1, "price": 12.5e2}
  ],
  "capture": true
}`

func BenchmarkDefaultFingerprint(b *testing.B) {
	for _, bc := range []struct{ name, ct, body string }{
		{"json", "application/json", benchBody},
		{"form", "application/x-www-form-urlencoded", "customer_id=cus_9s6XKzkNRiz8i3&amount=2500&currency=eur&description=Order+%231042&capture=true"},
		{"raw", "text/plain", benchBody},
	} {
		b.Run(bc.name, func(b *testing.B) {
			r := newRequest(bc.ct)
			body := []byte(bc.body)
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := DefaultFingerprint(r, "POST /orders/:id", body); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// TestDefaultFingerprintRequest: the fingerprint covers the method, the
// escaped path and the query (sorted by name, repeated values in order)
// besides the scope and the body.
func TestDefaultFingerprintRequest(t *testing.T) {
	const scope = "POST /orders/:id/payments"
	at := func(method, target string) []byte {
		t.Helper()
		r := httptest.NewRequest(method, target, nil)
		r.Header.Set("Content-Type", "application/json")
		got, err := DefaultFingerprint(r, scope, []byte(`{"amount":1}`))
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	same := []struct{ name, a, b string }{
		{"ok, parameters sorted by name", "/orders/1/payments?a=1&b=2", "/orders/1/payments?b=2&a=1"},
		{"ok, query escapes decoded", "/orders/1/payments?note=a+b&x=%2F", "/orders/1/payments?x=/&note=a%20b"},
		{"ok, empty query and none", "/orders/1/payments?", "/orders/1/payments"},
		{"ok, empty segments of the query ignored", "/orders/1/payments?a=1&&b=2", "/orders/1/payments?a=1&b=2"},
	}
	for _, tt := range same {
		t.Run(tt.name, func(t *testing.T) {
			if a, b := at("POST", tt.a), at("POST", tt.b); !bytes.Equal(a, b) {
				t.Fatalf("%s and %s: fingerprints differ", tt.a, tt.b)
			}
		})
	}
	differ := []struct{ name, methodB, a, b string }{
		{"nok, another resource", "POST", "/orders/1/payments", "/orders/2/payments"},
		{"nok, another query value", "POST", "/orders/1/payments?dry_run=true", "/orders/1/payments?dry_run=false"},
		{"nok, a query and none", "POST", "/orders/1/payments?dry_run=true", "/orders/1/payments"},
		{"nok, repeated values in another order", "POST", "/orders/1/payments?tag=a&tag=b", "/orders/1/payments?tag=b&tag=a"},
		{"nok, an escaped slash is not a slash", "POST", "/files/a%2Fb", "/files/a/b"},
		{"nok, a path escaped otherwise", "POST", "/files/a\"b", "/files/a%22b"},
		{"nok, unparseable query hashed raw", "POST", "/orders/1/payments?a=1;b=2", "/orders/1/payments?a=1&b=2"},
		{"nok, unparseable queries differ raw", "POST", "/orders/1/payments?a=1;b=2", "/orders/1/payments?b=2;a=1"},
		{"nok, another method", "PATCH", "/orders/1/payments", "/orders/1/payments"},
		{"nok, query name and value not run together", "POST", "/orders/1/payments?ab=c", "/orders/1/payments?a=bc"},
	}
	for _, tt := range differ {
		t.Run(tt.name, func(t *testing.T) {
			if a, b := at("POST", tt.a), at(tt.methodB, tt.b); bytes.Equal(a, b) {
				t.Fatalf("POST %s and %s %s: fingerprints agree", tt.a, tt.methodB, tt.b)
			}
		})
	}
	t.Run("ok, matches the documented preimage", func(t *testing.T) {
		got := at("POST", "/orders/1/payments?b=2&a=x+y")
		want := preimageHash(scope, "POST", "/orders/1/payments", "", 'q', "a=x+y&b=2", []string{"application/json"}, 'j', `{"amount":1}`)
		if !bytes.Equal(got, want) {
			t.Fatalf("got %x, want %x", got, want)
		}
		got = at("POST", "/a%2Fb?a=1;b")
		want = preimageHash(scope, "POST", "/a/b", "/a%2Fb", 'r', "a=1;b", []string{"application/json"}, 'j', `{"amount":1}`)
		if !bytes.Equal(got, want) {
			t.Fatalf("raw query: got %x, want %x", got, want)
		}
	})
	// Every part is framed: moving bytes from one part to the next changes
	// the fingerprint.
	t.Run("nok, parts never run together", func(t *testing.T) {
		req := func(method, path, query string) *http.Request {
			return &http.Request{Method: method, URL: &url.URL{Path: path, RawQuery: query}, Header: http.Header{}}
		}
		fps := map[string]string{}
		for _, c := range []struct {
			scope string
			r     *http.Request
			body  string
		}{
			{"s", req("POST", "/a", "b=c"), "d"},
			{"sPOST", req("", "/a", "b=c"), "d"},
			{"s", req("POST/a", "", "b=c"), "d"},
			{"s", req("POST", "/ab=c", ""), "d"},
			{"s", req("POST", "/a", ""), "b=cd"},
			{"s", req("POST", "/a", "b=cd"), ""},
			{"s", nil, "POST/ab=cd"},
		} {
			got, _ := DefaultFingerprint(c.r, c.scope, []byte(c.body))
			name := fmt.Sprintf("%q %v %q", c.scope, c.r, c.body)
			if c.r != nil {
				name = fmt.Sprintf("%q %q %q %q %q", c.scope, c.r.Method, c.r.URL.Path, c.r.URL.RawQuery, c.body)
			}
			if prev, ok := fps[string(got)]; ok {
				t.Fatalf("%s and %s: fingerprints agree", prev, name)
			}
			fps[string(got)] = name
		}
	})
}

// TestFingerprintCollidingNames: bodies that encoding/json reads
// differently because names collide case-insensitively (last wins) never
// share a fingerprint; DefaultFingerprint and FingerprintFields alike.
func TestFingerprintCollidingNames(t *testing.T) {
	const scope = "POST /orders"
	for _, f := range []struct {
		name string
		fp   Fingerprinter
	}{{"DefaultFingerprint", DefaultFingerprint}, {"FingerprintFields", FingerprintFields("item", "quantity", "a", "k")}} {
		t.Run(f.name, func(t *testing.T) {
			for _, tt := range []struct{ name, a, b string }{
				{"nok, names equal but for case reordered", `{"item":"tea","quantity":1,"Quantity":9}`, `{"item":"tea","Quantity":9,"quantity":1}`},
				{"nok, a repeated name reordered", `{"a":1,"a":2}`, `{"a":2,"a":1}`},
				{"nok, names equal after unescaping reordered", `{"a":1,"\u0041":2}`, `{"\u0041":2,"a":1}`},
				{"nok, Kelvin sign and k reordered", `{"a":0,"k":1,"\u212a":2}`, `{"a":0,"\u212a":2,"k":1}`},
			} {
				t.Run(tt.name, func(t *testing.T) {
					a, b := fp(t, f.fp, "application/json", scope, tt.a), fp(t, f.fp, "application/json", scope, tt.b)
					if bytes.Equal(a, b) {
						t.Fatalf("%s and %s: fingerprints agree", tt.a, tt.b)
					}
					if _, _, ok := jsontest.SameStruct([]byte(tt.a), []byte(tt.b)); ok {
						t.Fatalf("%s and %s: a struct reads them alike; the test is void", tt.a, tt.b)
					}
				})
			}
			for _, tt := range []struct{ name, a, b string }{
				{"ok, colliding names in order, others moved", `{"item":"tea","quantity":1,"Quantity":9}`, `{"quantity":1,"Quantity":9,"item":"tea"}`},
				{"ok, colliding names interleaved with others", `{"a":1,"item":"tea","A":2}`, `{"item":"tea","a":1,"A":2}`},
			} {
				t.Run(tt.name, func(t *testing.T) {
					a, b := fp(t, f.fp, "application/json", scope, tt.a), fp(t, f.fp, "application/json", scope, tt.b)
					if !bytes.Equal(a, b) {
						t.Fatalf("%s and %s: fingerprints differ", tt.a, tt.b)
					}
				})
			}
		})
	}
	t.Run("nok, FingerprintFields keeps names that match a field but for case", func(t *testing.T) {
		f := FingerprintFields("amount")
		a := fp(t, f, "application/json", scope, `{"Amount":1}`)
		b := fp(t, f, "application/json", scope, `{"Amount":2}`)
		if bytes.Equal(a, b) {
			t.Fatal("Amount is read into a field amount, yet 1 and 2 agree")
		}
		c := fp(t, f, "application/json", scope, `{"amount":1,"AMOUNT":2}`)
		d := fp(t, f, "application/json", scope, `{"AMOUNT":2,"amount":1}`)
		if bytes.Equal(c, d) {
			t.Fatal("colliding selected names reordered, yet the fingerprints agree")
		}
	})
}
