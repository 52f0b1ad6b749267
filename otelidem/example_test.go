package otelidem_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/memstore"
	"github.com/idemkit/idem/otelidem"
)

// The observer goes on the engine; here a ManualReader stands in for the
// exporter (Prometheus, OTLP) a service would use.
func Example() {
	reader := sdkmetric.NewManualReader()
	obs, err := otelidem.New(otelidem.WithMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))))
	if err != nil {
		panic(err)
	}
	e, err := core.New(memstore.New(), core.WithSingleCaller(), core.WithObserver(obs))
	if err != nil {
		panic(err)
	}
	h := e.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusCreated) }), core.Scope("orders"))
	for range 2 {
		r := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader(`{"item":"tea"}`))
		r.Header.Set(core.HeaderKey, "order-1")
		h.ServeHTTP(httptest.NewRecorder(), r)
	}

	var rm metricdata.ResourceMetrics
	_ = reader.Collect(context.Background(), &rm)
	for _, m := range rm.ScopeMetrics[0].Metrics {
		if m.Name == otelidem.MetricDecisions {
			for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
				d, _ := dp.Attributes.Value(otelidem.AttrDecision)
				fmt.Println(d.AsString(), dp.Value)
			}
		}
	}
	// Unordered output:
	// executed 1
	// replayed 1
}
