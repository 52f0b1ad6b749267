package core_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/memstore"
)

// A POST handler protected on a net/http ServeMux: the retry gets the first
// answer, and the handler runs once.
func Example() {
	e, err := core.New(memstore.New(), core.WithCaller(func(r *http.Request) (string, error) {
		return r.Header.Get("X-Account"), nil // from your auth middleware
	}))
	if err != nil {
		panic(err)
	}
	orders := 0
	mux := http.NewServeMux()
	mux.Handle("POST /orders", e.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		orders++
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":%d}`, orders)
	})))

	for range 2 {
		req := httptest.NewRequest("POST", "/orders", strings.NewReader(`{"item":"tea"}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-Account", "acct_1")
		req.Header.Set("Idempotency-Key", "8e03978e-40d5-43e8-bc93-6894a57f9324")
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, req)
		fmt.Println(w.Code, w.Body.String(), "replayed:", w.Header().Get("Idempotent-Replayed") == "true")
	}
	fmt.Println("orders created:", orders)
	// Output:
	// 201 {"id":1} replayed: false
	// 201 {"id":1} replayed: true
	// orders created: 1
}

// A message consumer runs its work once per message id; a redelivery gets
// the first run's result.
func ExampleEngine_Once() {
	e, _ := core.New(memstore.New(), core.WithSingleCaller())
	msg := core.Message{Consumer: "invoice-mailer", ID: "msg-42"}
	send := func(ctx context.Context) ([]byte, error) {
		fmt.Println("sending invoice")
		return []byte("mail-id-7"), nil
	}
	for range 2 {
		res, err := e.Once(context.Background(), msg, send)
		fmt.Println(string(res.Value), res.Replayed, err)
	}
	// Output:
	// sending invoice
	// mail-id-7 false <nil>
	// mail-id-7 true <nil>
}

// A handler that fails validation releases the key, so the corrected
// request can reuse it; a handler that is about to call a payment provider
// marks the effect and passes a downstream key.
func ExampleMarkEffect() {
	handler := func(w http.ResponseWriter, r *http.Request) {
		ctx := r.Context()
		if r.ContentLength == 0 {
			core.Release(ctx) // nothing happened: the key is free again
			http.Error(w, "empty body", http.StatusBadRequest)
			return
		}
		core.MarkEffect(ctx) // a 5xx from here on is indeterminate, not released
		chargeKey, err := core.DownstreamKey(ctx, "charge")
		if err != nil { // not the request's context: a bug, never call the provider without a key
			http.Error(w, "internal error", http.StatusInternalServerError)
			return
		}
		_ = chargeKey // pass as the provider's Idempotency-Key
		w.WriteHeader(http.StatusCreated)
	}
	_ = handler
}
