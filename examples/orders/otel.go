package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/exporters/stdout/stdoutmetric"
	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/otelidem"
)

// telemetry is the OpenTelemetry wiring of -otel: otelidem's observer on
// the engine, otelhttp's span around every request (the span otelidem adds
// its idem.decision event to), and the exporters.
type telemetry struct {
	observer core.Observer                   // otelidem's
	wrap     func(http.Handler) http.Handler // otelhttp around the whole API
	metrics  http.Handler                    // GET /metrics (-otel prometheus), or nil
	shutdown func(ctx context.Context) error // flushes the exporters
}

// setupTelemetry returns the wiring of -otel kind: nil for "" or "off";
// for "stdout", metrics every interval and every span, with its events, as
// JSON on out (the last metrics at shutdown); for "prometheus", metrics on
// GET /metrics (a registry of its own, not Prometheus's global one).
func setupTelemetry(kind string, out io.Writer, interval time.Duration) (*telemetry, error) {
	var (
		mp       *sdkmetric.MeterProvider
		tp       *sdktrace.TracerProvider
		metrics  http.Handler
		shutdown []func(context.Context) error
	)
	switch kind {
	case "", "off":
		return nil, nil
	case "stdout":
		me, err := stdoutmetric.New(stdoutmetric.WithWriter(out))
		if err != nil {
			return nil, fmt.Errorf("-otel stdout: %w", err)
		}
		te, err := stdouttrace.New(stdouttrace.WithWriter(out))
		if err != nil {
			return nil, fmt.Errorf("-otel stdout: %w", err)
		}
		mp = sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewPeriodicReader(me, sdkmetric.WithInterval(interval))))
		// A span is written when it ends: with the syncer, as the request
		// ends (a production service batches: sdktrace.WithBatcher).
		tp = sdktrace.NewTracerProvider(sdktrace.WithSyncer(te))
		shutdown = append(shutdown, tp.Shutdown)
	case "prometheus":
		reg := prometheus.NewRegistry()
		exporter, err := otelprom.New(otelprom.WithRegisterer(reg))
		if err != nil {
			return nil, fmt.Errorf("-otel prometheus: %w", err)
		}
		mp = sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter))
		metrics = promhttp.HandlerFor(reg, promhttp.HandlerOpts{})
	default:
		return nil, fmt.Errorf("-otel %q: want off, stdout or prometheus", kind)
	}
	shutdown = append(shutdown, mp.Shutdown)

	obs, err := otelidem.New(otelidem.WithMeterProvider(mp))
	if err != nil {
		return nil, err
	}
	httpOpts := []otelhttp.Option{otelhttp.WithMeterProvider(mp)}
	if tp != nil {
		httpOpts = append(httpOpts, otelhttp.WithTracerProvider(tp))
	}
	return &telemetry{
		observer: obs,
		wrap:     func(h http.Handler) http.Handler { return otelhttp.NewHandler(h, "orders", httpOpts...) },
		metrics:  metrics,
		shutdown: func(ctx context.Context) error {
			var errs []error
			for _, f := range shutdown {
				errs = append(errs, f(ctx))
			}
			return errors.Join(errs...)
		},
	}, nil
}

// observers calls each observer in turn (the engine takes one).
func observers(obs ...core.Observer) core.Observer {
	return func(ctx context.Context, ev core.Event) {
		for _, o := range obs {
			o(ctx, ev)
		}
	}
}
