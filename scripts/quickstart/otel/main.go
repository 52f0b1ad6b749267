// Command otel is the OpenTelemetry quick start (otelidem/README.md):
// every decision of the engine as metrics and span events.
package main

import (
	"log"
	"net/http"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/memstore"
	"github.com/idemkit/idem/otelidem"
)

func main() {
	mp := sdkmetric.NewMeterProvider()                       // with the reader or exporter of your choice
	obs, err := otelidem.New(otelidem.WithMeterProvider(mp)) // or otelidem.New(): the global MeterProvider
	if err != nil {
		log.Fatal(err)
	}
	caller := func(r *http.Request) (string, error) { return r.Header.Get("Authorization"), nil }
	e, err := core.New(memstore.New(), core.WithCaller(caller), core.WithObserver(obs))
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /orders", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusCreated) })
	log.Fatal(http.ListenAndServe("127.0.0.1:8080", e.Handler(mux)))
}
