package core

import (
	"encoding/hex"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestFingerprintStable: a fingerprint is stored with its record and
// compared with a retry's, maybe computed by a later build, so
// DefaultFingerprint's and FingerprintFields' values must never change
// for a given request (a change makes every retry across an upgrade a
// 422). The digests below were computed before the canonicaliser's
// second pass was simplified and must stay as they are; a deliberate
// change of the preimage is a new fingerprint version (fingerprintDomain).
func TestFingerprintStable(t *testing.T) {
	for _, tt := range []struct {
		name, target, ct, body string
		fields                 []string
		want                   string
	}{
		{"empty body", "/orders", "", "", nil, "c001cd613da8af054d9aa2dbd9eb6c83ee89f754b0c082c7976b92eae1e61ea3"},
		{"compact JSON, keys out of order", "/orders", "application/json", `{"item":"coffee","quantity":2,"note":"oat milk, extra hot","address":{"street":"1 Main St","city":"Springfield"}}`, nil, "6dfc42c066d699c6d2fbce65fb584ade63a34a608e7a791f488813176a29daea"},
		{"indented JSON, escapes, numbers as written", "/payments?b=2&a=1", "application/json; charset=utf-8", benchBody, nil, "f63becf7315423c1d2acf7425cb5cdabd76d3c93008b93668ca88f89ddd58c5e"},
		{"JSON with colliding names and unicode", "/p", "application/merchant+json", "{\"Qty\":9,\"qty\":1,\"\\u00e9t\\u00e9\":\"\\ud83d\\ude00\\n\",\"K\":[1.0,1e0,-0,{\"z\":null,\"A\":true}]}", nil, "ea306d932b748969d4a31e54dccebdf809574c7e1be012ac8a0e90281faf40c0"},
		{"JSON narrowed to fields", "/p", "application/json", `{"amount":1250,"Currency":"eur","note":"x"}`, []string{"amount", "currency"}, "e6c941db2f2215725b798412eec99ec6cd5a8d74c26bf3be2f0a270441381136"},
		{"JSON narrowed to fields, escaped and folded names", "/p", "application/json", `{"\u212a":1,"k":2,"x\u0041":{"b":1,"a":2},"ſ":3}`, []string{"K", "xa", "S"}, "d0e2969dab535614c42601a20ee407a688253d512f618de45469456c506837c8"},
		{"invalid JSON as raw bytes", "/p", "application/json", `{"a":1,}`, nil, "ae20ded6bf19035232270c9161d649ab211e8891d6b43ffa9a0f5b0bb9e577a6"},
		{"form", "/p", "application/x-www-form-urlencoded", "b=2&a=1&a=0", nil, "9ace43ce49447567b1177b0afcdc75734a7255c98392078037d4252d76e9e481"},
		{"raw text", "/p%2Fq", "text/plain", "hello", nil, "dc94d8a51e0d0fe734f08f90ead150272be2a5af0de886530661f2ff713941e8"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := httptest.NewRequest("POST", tt.target, strings.NewReader(tt.body))
			if tt.ct != "" {
				r.Header.Set("Content-Type", tt.ct)
			}
			f := DefaultFingerprint
			if tt.fields != nil {
				f = FingerprintFields(tt.fields...)
			}
			got, err := f(r, "", []byte(tt.body))
			if err != nil {
				t.Fatal(err)
			}
			if hex.EncodeToString(got) != tt.want {
				t.Errorf("fingerprint %x, want %s", got, tt.want)
			}
		})
	}
}
