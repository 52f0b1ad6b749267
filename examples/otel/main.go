// Command otel is the OpenTelemetry wiring of an idem service, on its own:
// otelidem's observer on the engine, otelhttp's span around every request
// (the span otelidem adds its idem.decision event to), and the exporters.
// Its API is the orders example's POST /orders, answered without a
// database (core/memstore), so that only the wiring is left to read.
//
//	go run ./examples/otel [-addr 127.0.0.1:8080] [-otel stdout|prometheus|off] [-otel-interval 10s]
//
// -otel stdout writes every span, with its events, and the metrics every
// -otel-interval and once more at shutdown, as JSON on standard output;
// -otel prometheus serves the metrics on GET /metrics (a registry of its
// own, not Prometheus's global one); -otel off (the default) has no
// telemetry. See README.md in this directory.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
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
	"github.com/idemkit/idem/core/memstore"
	"github.com/idemkit/idem/core/observe"
	"github.com/idemkit/idem/examples/internal/serve"
	"github.com/idemkit/idem/otelidem"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:8080", "listen address")
	kind := flag.String("otel", "off", "OpenTelemetry metrics and traces: off, stdout (JSON on standard output) or prometheus (GET /metrics)")
	interval := flag.Duration("otel-interval", 10*time.Second, "how often -otel stdout writes the metrics")
	flag.Parse()
	logger := slog.New(slog.NewTextHandler(os.Stderr, nil))
	if err := run(*addr, *kind, *interval, logger); err != nil {
		logger.Error("otel: " + err.Error())
		os.Exit(1)
	}
}

func run(addr, kind string, interval time.Duration, logger *slog.Logger) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	tel, err := setupTelemetry(kind, os.Stdout, interval)
	if err != nil {
		return err
	}
	var h http.Handler
	if tel == nil {
		h, err = orders(nil)
	} else {
		// Deferred first, so it runs last: the final metrics include the
		// requests that the graceful shutdown let finish.
		defer func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := tel.shutdown(ctx); err != nil {
				logger.Error("otel: telemetry shutdown: " + err.Error())
			}
		}()
		h, err = orders(tel.observer)
		h = tel.wrap(h)
		if tel.metrics != nil {
			mux := http.NewServeMux()
			mux.Handle("GET /metrics", tel.metrics)
			mux.Handle("/", h)
			h = mux
		}
	}
	if err != nil {
		return err
	}
	return serve.Run(ctx, logger, "otel", addr, h, "otel", kind)
}

// orders is the orders example's POST /orders, protected by an engine
// whose observer is obs (nil: none), the caller named by
// "Authorization: Bearer <account>".
func orders(obs observe.Observer) (http.Handler, error) {
	opts := []core.Option{core.WithCaller(func(r *http.Request) (string, error) {
		account, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		return strings.TrimSpace(account), nil
	})}
	if obs != nil {
		opts = append(opts, core.WithObserver(obs))
	}
	e, err := core.New(memstore.New(), opts...)
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /orders", func(w http.ResponseWriter, r *http.Request) {
		var order struct {
			Item     string `json:"item"`
			Quantity int    `json:"quantity"`
		}
		if err := json.NewDecoder(r.Body).Decode(&order); err != nil {
			http.Error(w, "want {\"item\": string, \"quantity\": int}", http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_ = json.NewEncoder(w).Encode(order)
	})
	return e.Handler(mux), nil
}

// telemetry is the OpenTelemetry wiring of -otel: otelidem's observer on
// the engine, otelhttp's span around every request (the span otelidem adds
// its idem.decision event to), and the exporters.
type telemetry struct {
	observer observe.Observer                // otelidem's
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
