package idemclient_test

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"time"

	"github.com/idemkit/idem/idemclient"
)

// A server that is busy with the key at first (409 + Retry-After), then
// answers; the client retries with the same key and reports what happened.
func Example() {
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) == 1 {
			w.Header().Set("Retry-After", "0")
			w.WriteHeader(http.StatusConflict)
			return
		}
		w.Header().Set("Idempotent-Replayed", "true")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, `{"id":1}`)
	}))
	defer srv.Close()

	client, err := idemclient.NewClient(idemclient.WithMaxElapsed(30 * time.Second))
	if err != nil {
		panic(err)
	}
	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/orders", strings.NewReader(`{"item":"tea"}`))
	req.Header.Set("Idempotency-Key", "order-7f3a") // or leave it out: idemclient makes one
	resp, err := client.Do(req)
	if err != nil {
		var e *idemclient.Error
		if errors.As(err, &e) {
			fmt.Println("not answered; retry later with key", e.Key)
		}
		return
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	fmt.Println(resp.StatusCode, string(body))
	fmt.Println("key:", idemclient.Key(resp), "attempts:", idemclient.Attempts(resp), "replayed:", idemclient.Replayed(resp))
	// Output:
	// 201 {"id":1}
	// key: order-7f3a attempts: 2 replayed: true
}
