package core

import (
	"github.com/idemkit/idem/internal/canonjson"
	"github.com/idemkit/idem/internal/jsontest"

	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net/http"
	"net/url"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// fuzzIdentity modes, bit by bit.
const (
	fiType1  = 1 << iota // with fiType2: the body's type: JSON, form, text, JSON (again)
	fiType2              //
	fiDerive             // the second request is the first rewritten (reordered, re-escaped), not the fuzzer's
	fiFields             // FingerprintFields("a", "amount", "items") instead of DefaultFingerprint
	fiMethod             // the second request is a PATCH
)

var fuzzFields = []string{"a", "amount", "items"}

var fuzzIdentityTypes = [4]string{"application/json", "application/x-www-form-urlencoded", "text/plain", "application/json; charset=utf-8"}

// fieldsProbe is what a handler reads through a struct when the route
// fingerprints FingerprintFields("a", "amount", "items").
type fieldsProbe struct {
	A, Amount any
	Items     []struct{ A, B, Sku, Qty any }
}

// FuzzRequestIdentity: whenever two requests get the same fingerprint,
// everything the handler can see is the same: the method, the path (decoded
// and escaped), the query as url.Values (values in order), and the body as
// the handler reads it. For JSON that is the value decoded into any with
// UseNumber (numbers compared exactly) and the value decoded into a struct,
// which matches member names case-insensitively and lets the last of
// colliding members win; for a form, the parsed values; otherwise the
// bytes. The second request is either the fuzzer's own or the first one
// rewritten (members reordered, strings re-escaped, numbers respelt, query
// parameters reordered, path bytes percent-encoded), which is where
// canonicalisation could go wrong.
func FuzzRequestIdentity(f *testing.F) {
	for _, s := range []struct {
		mode          uint8
		path1, query1 string
		body1         string
		path2, query2 string
		body2         string
		seed          uint64
	}{
		{0, "/orders/1/payments", "", `{"amount":1000}`, "/orders/2/payments", "", `{"amount":1000}`, 0},
		{0, "/orders", "dry_run=true", `{"amount":1}`, "/orders", "dry_run=false", `{"amount":1}`, 0},
		{0, "/orders", "", `{"item":"tea","quantity":1,"Quantity":9}`, "/orders", "", `{"item":"tea","Quantity":9,"quantity":1}`, 0},
		{0, "/orders", "", `{"a":1,"a":2}`, "/orders", "", `{"a":2,"a":1}`, 0},
		{fiDerive, "/orders", "b=2&a=1&a=0", `{"items":[{"sku":"x","qty":1.0,"Qty":2}],"Amount":1e2,"amount":100}`, "", "", "", 7},
		{fiDerive | fiFields, "/orders", "", `{"a":1,"A":2,"amount":{"b":1,"a":[1,2]},"note":"x"}`, "", "", "", 3},
		{fiFields, "/orders", "", `{"amount":1,"AMOUNT":2}`, "/orders", "", `{"AMOUNT":2,"amount":1}`, 0},
		{fiDerive, "/files/a%2Fb", "x=%20&y=+", `{"k":1,"\u212a":2,"s":"\u00e9\n"}`, "", "", "", 11},
		{fiType1 | fiDerive, "/orders", "a=1;b=2", "b=2&a=x+y&a=%7e", "", "", "", 5},
		{fiType2, "/orders", "", "hello", "/orders", "", "hello ", 0},
		{fiMethod, "/orders", "", `{}`, "/orders", "", `{}`, 0},
		{fiDerive, "/orders", "", `[{"b":{"d":1,"c":[true,null,"\ud83d\ude00"]},"a":-0.0},12345678901234567890.5]`, "", "", "", 2},
	} {
		f.Add(s.mode, s.path1, s.query1, []byte(s.body1), s.path2, s.query2, []byte(s.body2), s.seed)
	}
	f.Fuzz(func(t *testing.T, mode uint8, path1, query1 string, body1 []byte, path2, query2 string, body2 []byte, seed uint64) {
		ctype := fuzzIdentityTypes[mode&(fiType1|fiType2)]
		if mode&fiDerive != 0 {
			rng := rand.New(rand.NewPCG(seed, seed>>32))
			path2 = respellPath(rng, path1)
			query2 = reorderQuery(rng, query1)
			body2 = rewriteBody(rng, ctype, body1)
		}
		r1, r2 := identityRequest("POST", path1, query1, ctype), identityRequest("POST", path2, query2, ctype)
		if r1 == nil || r2 == nil {
			return // not a request a server would hand to a handler
		}
		if mode&fiMethod != 0 {
			r2.Method = "PATCH"
		}
		fp := DefaultFingerprint
		if mode&fiFields != 0 {
			fp = FingerprintFields(fuzzFields...)
		}
		f1, _ := fp(r1, "POST /orders", body1)
		f2, _ := fp(r2, "POST /orders", body2)
		if !bytes.Equal(f1, f2) {
			return
		}
		what := fmt.Sprintf("same fingerprint for\n%s %q ? %q body %q\n%s %q ? %q body %q", r1.Method, r1.URL.EscapedPath(), r1.URL.RawQuery, body1, r2.Method, r2.URL.EscapedPath(), r2.URL.RawQuery, body2)
		if r1.Method != r2.Method {
			t.Fatalf("%s\nbut the methods differ", what)
		}
		if r1.URL.Path != r2.URL.Path || r1.URL.RawPath != r2.URL.RawPath || r1.URL.EscapedPath() != r2.URL.EscapedPath() {
			t.Fatalf("%s\nbut the paths differ: %q %q, %q %q", what, r1.URL.Path, r1.URL.RawPath, r2.URL.Path, r2.URL.RawPath)
		}
		if q1, q2 := r1.URL.Query(), r2.URL.Query(); !reflect.DeepEqual(q1, q2) {
			t.Fatalf("%s\nbut the queries differ: %v, %v", what, q1, q2)
		}
		switch mode & (fiType1 | fiType2) {
		case 1: // form
			v1, err1 := url.ParseQuery(string(body1))
			v2, err2 := url.ParseQuery(string(body2))
			if mode&fiFields != 0 { // the application chose to look at these only
				for _, v := range []url.Values{v1, v2} {
					maps.DeleteFunc(v, func(k string, _ []string) bool { return !slices.Contains(fuzzFields, k) })
				}
			}
			if (err1 == nil) != (err2 == nil) || !reflect.DeepEqual(v1, v2) {
				t.Fatalf("%s\nbut the forms differ: %v (%v), %v (%v)", what, v1, err1, v2, err2)
			}
			if err1 != nil && !bytes.Equal(body1, body2) {
				t.Fatalf("%s\nbut the unparseable forms differ", what)
			}
		case 2: // text
			if !bytes.Equal(body1, body2) {
				t.Fatalf("%s\nbut the bodies differ", what)
			}
		default: // JSON
			_, err1 := canonjson.Append(nil, body1)
			_, err2 := canonjson.Append(nil, body2)
			if err1 != nil || err2 != nil {
				if !bytes.Equal(body1, body2) {
					t.Fatalf("%s\nbut the raw bodies differ (%v, %v)", what, err1, err2)
				}
				return
			}
			if mode&fiFields != 0 {
				if s1, s2, ok := jsontest.SameDecoded[fieldsProbe](body1, body2); !ok {
					t.Fatalf("%s\nbut the selected fields decode differently:\n%s\n%s", what, s1, s2)
				}
				return
			}
			v1, _ := jsontest.DecodeUseNumber(body1)
			v2, _ := jsontest.DecodeUseNumber(body2)
			if p, ok := jsontest.SameJSON(v1, v2, "$"); !ok {
				t.Fatalf("%s\nbut the values differ at %s", what, p)
			}
			if s1, s2, ok := jsontest.SameStruct(body1, body2); !ok {
				t.Fatalf("%s\nbut they decode into a struct differently:\n%s\n%s", what, s1, s2)
			}
		}
	})
}

// identityRequest builds the request a server hands to a handler for the
// request target path?query, or nil when no server would.
func identityRequest(method, path, query, ctype string) *http.Request {
	target := path
	if query != "" {
		target += "?" + query
	}
	if !strings.HasPrefix(target, "/") {
		return nil
	}
	u, err := url.ParseRequestURI(target)
	if err != nil {
		return nil
	}
	r := &http.Request{Method: method, URL: u, RequestURI: target, Header: http.Header{}}
	r.Header.Set("Content-Type", ctype)
	return r
}

// respellPath percent-encodes a byte of p, or leaves it as it is.
func respellPath(rng *rand.Rand, p string) string {
	if p == "" || rng.IntN(3) == 0 {
		return p
	}
	i := rng.IntN(len(p))
	hex := "%%%02X"
	if rng.IntN(2) == 0 {
		hex = "%%%02x"
	}
	return p[:i] + fmt.Sprintf(hex, p[i]) + p[i+1:]
}

// reorderQuery shuffles the parameters of q, and sometimes spells a space
// differently.
func reorderQuery(rng *rand.Rand, q string) string {
	ps := strings.Split(q, "&")
	rng.Shuffle(len(ps), func(i, j int) { ps[i], ps[j] = ps[j], ps[i] })
	q = strings.Join(ps, "&")
	if rng.IntN(2) == 0 {
		q = strings.ReplaceAll(q, "+", "%20")
	}
	return q
}

// rewriteBody writes the body of the type again: a JSON document with its
// members in another order, other whitespace, escapes and number
// spellings; a form with its fields reordered; anything else as it is.
func rewriteBody(rng *rand.Rand, ctype string, body []byte) []byte {
	switch {
	case strings.HasPrefix(ctype, "application/json"):
		d := json.NewDecoder(bytes.NewReader(body))
		d.UseNumber()
		v, err := tokenValue(d, 0)
		if err != nil {
			return body
		}
		if _, err := d.Token(); err != io.EOF {
			return body
		}
		return jsontest.RenderValue(rng, nil, v)
	case ctype == "application/x-www-form-urlencoded":
		return []byte(reorderQuery(rng, string(body)))
	}
	return body
}

// tokenValue reads one value from d as jsontest.RenderValue's types, keeping every
// member of an object (repeated names too) in order.
func tokenValue(d *json.Decoder, depth int) (any, error) {
	if depth > canonjson.MaxDepth {
		return nil, fmt.Errorf("too deep")
	}
	tok, err := d.Token()
	if err != nil {
		return nil, err
	}
	switch tok := tok.(type) {
	case json.Delim:
		if tok == '[' {
			a := []any{}
			for d.More() {
				v, err := tokenValue(d, depth+1)
				if err != nil {
					return nil, err
				}
				a = append(a, v)
			}
			_, err := d.Token()
			return a, err
		}
		o := jsontest.Object{}
		for d.More() {
			k, err := d.Token()
			if err != nil {
				return nil, err
			}
			v, err := tokenValue(d, depth+1)
			if err != nil {
				return nil, err
			}
			o = append(o, jsontest.Member{Key: k.(string), Value: v})
		}
		_, err := d.Token()
		return o, err
	case string:
		return jsontest.String(tok), nil
	case json.Number:
		return string(tok), nil
	case bool:
		return fmt.Sprint(tok), nil
	case nil:
		return "null", nil
	}
	return nil, fmt.Errorf("unexpected token %v", tok)
}
