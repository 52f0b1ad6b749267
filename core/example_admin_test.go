package core_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/admin"
	"github.com/idemkit/idem/core/memstore"
	"github.com/idemkit/idem/core/store"
)

// An operator finds the payment whose outcome is unknown and records the
// answer the provider confirms; the client's retry then gets it.
func ExampleEngine_ResolveRecord() {
	e, _ := core.New(memstore.New(), core.WithSingleCaller(),
		core.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
	mux := http.NewServeMux()
	mux.Handle("POST /payments", e.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_ = core.MarkEffect(r.Context()) // about to charge
		http.Error(w, "the provider timed out", http.StatusBadGateway)
	})))
	pay := func() *httptest.ResponseRecorder {
		req := httptest.NewRequest("POST", "/payments", strings.NewReader(`{"amount":100}`))
		req.Header.Set("Idempotency-Key", "8e03978e")
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, req)
		return w
	}
	pay()

	ctx := context.Background()
	page, _ := e.Records(ctx, admin.Query{State: store.StateIndeterminate})
	stuck := page.Records[0]
	fmt.Println(stuck.State, stuck.Status, stuck.Key)

	id, _ := store.ParseID(stuck.ID) // or the record_id a client quotes
	_, err := e.ResolveRecord(ctx, id, core.Resolution{Outcome: core.OutcomeApplied, Response: &core.Response{
		Status: http.StatusCreated, Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(`{"payment":"pay_1"}`),
	}}, "the provider's dashboard shows the charge (ticket OPS-12)")
	fmt.Println(err)
	w := pay()
	fmt.Println(w.Code, w.Body.String())

	// A recorded answer is final.
	err = e.ReleaseRecord(ctx, id, "by mistake")
	fmt.Println(errors.Is(err, core.ErrFenced))
	// Output:
	// indeterminate 502 8e03978e
	// <nil>
	// 201 {"payment":"pay_1"}
	// true
}

// The operator's operations for an admin router, behind the
// application's own authentication (requireOperator stands for it).
func ExampleEngine_AdminHandler() {
	e, _ := core.New(memstore.New(), core.WithSingleCaller())
	requireOperator := func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Header.Get("Authorization") != "Bearer operator-token" { // your authentication here
				http.Error(w, "forbidden", http.StatusForbidden)
				return
			}
			next.ServeHTTP(w, r)
		})
	}
	mux := http.NewServeMux()
	mux.Handle("/admin/idem/", http.StripPrefix("/admin/idem", requireOperator(e.AdminHandler())))

	req := httptest.NewRequest("GET", "/admin/idem/records?state=indeterminate&older=5m", nil)
	req.Header.Set("Authorization", "Bearer operator-token")
	w := httptest.NewRecorder()
	mux.ServeHTTP(w, req)
	fmt.Println(w.Code, w.Body.String())
	// Output:
	// 200 {"records":[]}
}
