// Command client is the client quick start (idemclient/README.md): every
// non-safe request carries an Idempotency-Key, and a request whose answer
// was lost is sent again with the same key and the same body.
package main

import (
	"bytes"
	"context"
	"errors"
	"log"
	"net/http"
	"time"

	"github.com/idemkit/idem/idemclient"
)

func main() {
	ctx := context.Background()
	client, err := idemclient.NewClient() // an *http.Client over http.DefaultTransport
	if err != nil {
		log.Fatal(err)
	}
	// or, under a client of your own:
	tr, err := idemclient.NewTransport(http.DefaultTransport, idemclient.WithMaxElapsed(2*time.Minute))
	if err != nil {
		log.Fatal(err)
	}
	_ = &http.Client{Transport: tr}

	body := []byte(`{"amount_cents":500}`)
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://127.0.0.1:8080/orders/1/payments", bytes.NewReader(body))
	req.Header.Set("Idempotency-Key", idemclient.NewKey()) // optional: without it, a fresh UUID v4
	resp, err := client.Do(req)
	if err != nil {
		var e *idemclient.Error
		if errors.As(err, &e) {
			// No answer after e.Attempts attempts. The payment may have
			// happened: retry it later with e.Key, never with a new key.
			log.Fatalf("no answer for key %s after %d attempts", e.Key, e.Attempts)
		}
		log.Fatal(err)
	}
	defer resp.Body.Close()
	log.Printf("replayed %v, key %s, attempts %d",
		idemclient.Replayed(resp), // true: the server answered from its record (Idempotent-Replayed: true)
		idemclient.Key(resp),      // the key every attempt carried
		idemclient.Attempts(resp)) // how many attempts it took
}
