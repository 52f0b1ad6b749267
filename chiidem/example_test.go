package chiidem_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/go-chi/chi/v5"
	"github.com/idemkit/idem/chiidem"
	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/memstore"
)

type exampleAccount struct{}

// One line protects every POST and PATCH route of a chi router, even
// installed with r.Use before chi has routed the request: a key is unique
// within its caller, so a retry replays, and the same key sent for another
// order (or to another route) is a 422. The caller comes from the request
// context, where your auth middleware put it.
func Example() {
	e, err := core.New(memstore.New(), core.WithCaller(func(r *http.Request) (string, error) {
		account, _ := r.Context().Value(exampleAccount{}).(string)
		return account, nil
	}))
	if err != nil {
		panic(err)
	}

	r := chi.NewRouter()
	r.Use(chiidem.New(e))
	refunds := 0
	r.Post("/orders/{id}/refunds", func(w http.ResponseWriter, r *http.Request) {
		refunds++
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"refund":%d,"order":%q}`, refunds, chi.URLParam(r, "id"))
	})

	for _, order := range []string{"1", "1"} {
		req := httptest.NewRequest("POST", "/orders/"+order+"/refunds", strings.NewReader(`{"amount":5}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", "8e03978e-40d5-43e8-bc93-6894a57f9324")
		req = req.WithContext(context.WithValue(req.Context(), exampleAccount{}, "acct_1")) // your auth
		w := httptest.NewRecorder()
		r.ServeHTTP(w, req)
		fmt.Println(w.Code, w.Body.String(), "replayed:", w.Header().Get("Idempotent-Replayed") == "true")
	}
	fmt.Println("refunds made:", refunds)
	// Output:
	// 201 {"refund":1,"order":"1"} replayed: false
	// 201 {"refund":1,"order":"1"} replayed: true
	// refunds made: 1
}

// Per route, with route options.
func ExampleNew() {
	e, _ := core.New(memstore.New(), core.WithSingleCaller())
	r := chi.NewRouter()
	r.With(chiidem.New(e, core.Scope("create-payment"), core.Leased())).Post("/payments", func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
	})
	fmt.Println("ok")
	// Output: ok
}

// chi's idiom for "every route but these": a Config with a Skipper over
// the request, as middleware.Maybe takes (a middleware installed with Use
// runs before routing, so it sees the path, not the pattern).
func ExampleNewWithConfig() {
	e, _ := core.New(memstore.New(), core.WithSingleCaller())
	r := chi.NewRouter()
	r.Use(chiidem.NewWithConfig(chiidem.Config{
		Engine:  e,
		Skipper: func(r *http.Request) bool { return strings.HasPrefix(r.URL.Path, "/webhooks/") },
	}))
	r.Post("/webhooks/{provider}", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNoContent) })

	w := httptest.NewRecorder()
	r.ServeHTTP(w, httptest.NewRequest("POST", "/webhooks/stripe", nil)) // no key needed: skipped
	fmt.Println(w.Code)
	// Output: 204
}
