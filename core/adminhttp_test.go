package core_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/idemkit/idem/core/admin"
	"github.com/idemkit/idem/core/memstore"
	"github.com/idemkit/idem/core/store"
)

// admin sends an operator's request to the admin handler mounted under
// /admin/idem, and decodes a JSON answer into v (when not nil).
func adm(t *testing.T, h http.Handler, method, path, body string, v any) *httptest.ResponseRecorder {
	t.Helper()
	r := httptest.NewRequest(method, "/admin/idem"+path, strings.NewReader(body))
	if body != "" {
		r.Header.Set("Content-Type", "application/json")
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	if v != nil && w.Code < 300 {
		if ct := w.Header().Get("Content-Type"); ct != "application/json" {
			t.Fatalf("%s %s: Content-Type %q", method, path, ct)
		}
		if err := json.Unmarshal(w.Body.Bytes(), v); err != nil {
			t.Fatalf("%s %s: %v in %s", method, path, err, w.Body)
		}
	}
	return w
}

// The admin handler lists, shows, resolves and releases records over
// JSON, and answers what it refuses with problem documents.
func TestAdminHandler(t *testing.T) {
	p := newPayments(t, memstore.New())
	mux := http.NewServeMux()
	mux.Handle("/admin/idem/", http.StripPrefix("/admin/idem", p.e.AdminHandler()))
	p.pay("k1")
	p.pay("k2")

	var page admin.Page
	if w := adm(t, mux, "GET", "/records", "", &page); w.Code != 200 || len(page.Records) != 2 || page.Next != "" {
		t.Fatalf("GET /records: %d %s", w.Code, w.Body)
	}
	if w := adm(t, mux, "GET", "/records?state=indeterminate&older=0s&limit=1", "", &page); w.Code != 200 || len(page.Records) != 1 || page.Next == "" {
		t.Fatalf("GET /records?limit=1: %d %s", w.Code, w.Body)
	}
	var rest admin.Page
	if w := adm(t, mux, "GET", "/records?limit=1&after="+page.Next, "", &rest); w.Code != 200 || len(rest.Records) != 1 || rest.Records[0].ID == page.Records[0].ID {
		t.Fatalf("GET the second page: %d %s", w.Code, w.Body)
	}
	var none admin.Page
	if w := adm(t, mux, "GET", "/records?state=completed", "", &none); w.Code != 200 || none.Records == nil || len(none.Records) != 0 {
		t.Fatalf("GET /records?state=completed: %d %s, want an empty list", w.Code, w.Body)
	}
	id := page.Records[0].ID
	other := rest.Records[0].ID

	var shown admin.Record
	if w := adm(t, mux, "GET", "/records/"+id, "", &shown); w.Code != 200 || shown.Response == nil || shown.Response.Status != 502 {
		t.Fatalf("GET /records/{id}: %d %s", w.Code, w.Body)
	}

	var resolved admin.Record
	w := adm(t, mux, "POST", "/records/"+id+"/resolve",
		`{"outcome":"applied","reason":"captured","response":{"status":201,"header":{"Content-Type":["application/json"]},"body":"{\"payment\":\"pay_1\"}"}}`, &resolved)
	if w.Code != 200 || resolved.State != "completed" || resolved.Response == nil || resolved.Response.Body != `{"payment":"pay_1"}` {
		t.Fatalf("POST resolve applied: %d %s", w.Code, w.Body)
	}
	if w := p.pay(shown.Key); w.Code != 201 || w.Body.String() != `{"payment":"pay_1"}` {
		t.Fatalf("retry after the resolution: %d %s", w.Code, w.Body)
	}
	var released map[string]string
	if w := adm(t, mux, "POST", "/records/"+other+"/resolve", `{"outcome":"not_applied","reason":"no charge"}`, &released); w.Code != 200 ||
		released["state"] != "absent" || released["record_id"] != other {
		t.Fatalf("POST resolve not_applied: %d %s", w.Code, w.Body)
	}

	missing := store.Identity{Key: "never"}.ID().String()
	for _, tc := range []struct {
		name, method, path, body string
		ctype                    string
		want                     int
	}{
		{"unknown state", "GET", "/records?state=stuck", "", "", 400},
		{"bad age", "GET", "/records?older=soon", "", "", 400},
		{"bad limit", "GET", "/records?limit=0", "", "", 400},
		{"limit over the maximum", "GET", "/records?limit=100000", "", "", 400},
		{"bad cursor", "GET", "/records?after=x", "", "", 400},
		{"bad id", "GET", "/records/xyz", "", "", 400},
		{"missing record", "GET", "/records/" + missing, "", "", 404},
		{"release of a missing record", "POST", "/records/" + missing + "/release", `{"reason":"r"}`, "application/json", 404},
		{"release of a completed record", "POST", "/records/" + id + "/release", `{"reason":"r"}`, "application/json", 409},
		{"release without a reason", "POST", "/records/" + id + "/release", `{}`, "application/json", 400},
		{"a form post", "POST", "/records/" + id + "/release", `reason=r`, "application/x-www-form-urlencoded", 415},
		{"an unknown field", "POST", "/records/" + id + "/resolve", `{"outcome":"applied","reason":"r","resonse":{}}`, "application/json", 400},
		{"two values", "POST", "/records/" + id + "/release", `{"reason":"r"}{}`, "application/json", 400},
		{"an unknown outcome", "POST", "/records/" + id + "/resolve", `{"outcome":"maybe","reason":"r"}`, "application/json", 400},
		{"applied without a response", "POST", "/records/" + id + "/resolve", `{"outcome":"applied","reason":"r"}`, "application/json", 400},
		{"GET of an action", "GET", "/records/" + id + "/release", "", "", 405},
	} {
		r := httptest.NewRequest(tc.method, "/admin/idem"+tc.path, strings.NewReader(tc.body))
		if tc.ctype != "" {
			r.Header.Set("Content-Type", tc.ctype)
		}
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, r)
		if w.Code != tc.want {
			t.Errorf("%s: %d %s, want %d", tc.name, w.Code, w.Body, tc.want)
			continue
		}
		if tc.want != 405 && w.Header().Get("Content-Type") != "application/problem+json" {
			t.Errorf("%s: Content-Type %q, want a problem document", tc.name, w.Header().Get("Content-Type"))
		}
	}
}

// An attempt that is running is refused with 409: the operator waits for
// its lease to lapse.
func TestAdminHandlerRefusesARunningAttempt(t *testing.T) {
	p := newPayments(t, memstore.New())
	p.block = make(chan struct{})
	done := make(chan struct{})
	go func() { p.pay("k1"); close(done) }()
	<-p.inside
	defer func() { close(p.block); <-done }()
	h := http.StripPrefix("/admin/idem", p.e.AdminHandler())
	var page admin.Page
	adm(t, h, "GET", "/records?state=in_progress", "", &page)
	if len(page.Records) != 1 {
		t.Fatalf("in progress: %+v", page)
	}
	if w := adm(t, h, "POST", "/records/"+page.Records[0].ID+"/release", `{"reason":"looks stuck"}`, nil); w.Code != 409 || !strings.Contains(w.Body.String(), "holds the record") {
		t.Fatalf("release of a running attempt: %d %s, want 409", w.Code, w.Body)
	}
}
