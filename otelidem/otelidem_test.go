package otelidem_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/admin"
	"github.com/idemkit/idem/core/memstore"
	"github.com/idemkit/idem/core/observe"
	"github.com/idemkit/idem/core/store"
	"github.com/idemkit/idem/otelidem"
)

// stepClock advances a millisecond at every reading, so every duration the
// engine measures is positive and the same on every run.
func stepClock() func() time.Time {
	var mu sync.Mutex
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	return func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		now = now.Add(time.Millisecond)
		return now
	}
}

// downStore is a store whose claims fail as an unreachable database's do.
type downStore struct{ store.Store }

func (downStore) Claim(context.Context, store.ClaimRequest) (store.ClaimResult, error) {
	return store.ClaimResult{}, core.ErrStoreUnavailable
}

// fixture is an engine with the observer, served over HTTP behind a
// middleware that starts a span per request (as otelhttp does), with the
// SDK's in-memory readers.
type fixture struct {
	reader  *sdkmetric.ManualReader
	spans   *tracetest.SpanRecorder
	srv     *httptest.Server
	gate    chan struct{} // the handler of /slow waits on it
	entered chan struct{} // the handler of /slow got there
}

func newFixture(t *testing.T, store store.Store, opts ...otelidem.Option) (*fixture, observe.Observer) {
	f := &fixture{reader: sdkmetric.NewManualReader(), spans: tracetest.NewSpanRecorder(), gate: make(chan struct{}), entered: make(chan struct{}, 1)}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(f.reader))
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(f.spans))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()); _ = tp.Shutdown(context.Background()) })
	obs, err := otelidem.New(append([]otelidem.Option{otelidem.WithMeterProvider(mp)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	e, err := core.New(store, core.WithSingleCaller(), core.WithClock(stepClock()), core.WithObserver(obs))
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("POST /orders", e.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
	})))
	mux.Handle("POST /slow", e.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.entered <- struct{}{}
		<-f.gate
		w.WriteHeader(http.StatusCreated)
	})))
	tracer := tp.Tracer("test")
	f.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, span := tracer.Start(r.Context(), r.Method+" "+r.URL.Path)
		defer span.End()
		mux.ServeHTTP(w, r.WithContext(ctx))
	}))
	t.Cleanup(f.srv.Close)
	return f, obs
}

func (f *fixture) post(t *testing.T, path, key, body string) int {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, f.srv.URL+path, strings.NewReader(body))
	if key != "" {
		req.Header.Set(core.HeaderKey, key)
	}
	resp, err := f.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// collect returns, per metric name, the count of each data point by its
// idem.decision attribute (a counter's value, a histogram's count), and
// the scopes and routes seen (a data point without idem.route: route "-").
func (f *fixture) collect(t *testing.T) (map[string]map[string]int64, map[string]bool, map[string]bool) {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := f.reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	out, scopes, routes := map[string]map[string]int64{}, map[string]bool{}, map[string]bool{}
	for _, sm := range rm.ScopeMetrics {
		if sm.Scope.Name != otelidem.ScopeName {
			t.Errorf("instrumentation scope %q, want %q", sm.Scope.Name, otelidem.ScopeName)
		}
		for _, m := range sm.Metrics {
			byDecision := map[string]int64{}
			add := func(attrs attribute.Set, n int64) {
				d, _ := attrs.Value(otelidem.AttrDecision)
				byDecision[d.AsString()] += n
				if s, ok := attrs.Value(otelidem.AttrScope); ok {
					scopes[s.AsString()] = true
				}
				if r, ok := attrs.Value(otelidem.AttrRoute); ok {
					routes[r.AsString()] = true
				} else {
					routes["-"] = true
				}
			}
			switch data := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, dp := range data.DataPoints {
					add(dp.Attributes, dp.Value)
				}
			case metricdata.Histogram[float64]:
				for _, dp := range data.DataPoints {
					add(dp.Attributes, int64(dp.Count))
					if dp.Sum <= 0 {
						t.Errorf("%s: a zero sum of %d durations", m.Name, dp.Count)
					}
				}
			default:
				t.Errorf("%s: unexpected data %T", m.Name, m.Data)
			}
			out[m.Name] = byDecision
		}
	}
	return out, scopes, routes
}

func TestMetricsAndSpanEvents(t *testing.T) {
	// Rule: every decision is counted by kind (idem.decision) and scope;
	// claims and completions are timed; each request's span gets one
	// idem.decision event with the record's id, key and status.
	f, obs := newFixture(t, memstore.New())
	steps := []struct {
		path, key, body string
		status          int
	}{
		{"/orders", "k1", `{"item":"tea"}`, 201}, // executed
		{"/orders", "k1", `{"item":"tea"}`, 201}, // replayed
		{"/orders", "k1", `{"item":"mug"}`, 422}, // mismatch
		{"/orders", "", `{"item":"tea"}`, 400},   // invalid: no key
	}
	for _, s := range steps {
		if got := f.post(t, s.path, s.key, s.body); got != s.status {
			t.Fatalf("POST %s key %q: %d, want %d", s.path, s.key, got, s.status)
		}
	}
	// A real in-flight duplicate: the first holds the key until the gate.
	first := make(chan int)
	go func() { first <- f.post(t, "/slow", "k2", `{}`) }()
	<-f.entered
	if got := f.post(t, "/slow", "k2", `{}`); got != http.StatusConflict {
		t.Fatalf("in-flight duplicate: %d, want 409", got)
	}
	close(f.gate)
	if got := <-first; got != 201 {
		t.Fatalf("slow first: %d", got)
	}
	// A lease lost is reported by the engine when a takeover fenced an
	// attempt; the observer is a plain function: feed it the event.
	obs(context.Background(), observe.Event{Decision: observe.DecisionLeaseLost, Route: "/orders", Duration: time.Second})

	got, scopes, routes := f.collect(t)
	want := map[string]map[string]int64{
		otelidem.MetricDecisions: {"executed": 2, "replayed": 1, "mismatch": 1, "invalid": 1, "in_progress": 1, "lease_lost": 1},
		// The invalid request never reached the store; the lease-lost
		// event above carries no claim or completion time.
		otelidem.MetricClaimDuration:      {"executed": 2, "replayed": 1, "mismatch": 1, "in_progress": 1},
		otelidem.MetricCompletionDuration: {"executed": 2},
	}
	for name, w := range want {
		if fmt.Sprint(got[name]) != fmt.Sprint(w) {
			t.Errorf("%s: %v, want %v", name, got[name], w)
		}
	}
	if d := got[otelidem.MetricDuration]; d["executed"] != 2 || d["lease_lost"] != 1 {
		t.Errorf("%s: %v", otelidem.MetricDuration, d)
	}
	if len(scopes) != 1 || !scopes[""] {
		t.Errorf("scopes %v, want only the empty scope (no core.Scope option)", scopes)
	}
	if !routes["/orders"] || !routes["/slow"] || len(routes) != 2 {
		t.Errorf("routes %v, want the ServeMux patterns on every data point", routes)
	}

	// Span events: one per request's span, with the decision.
	var events []string
	for _, s := range f.spans.Ended() {
		for _, ev := range s.Events() {
			if ev.Name != otelidem.EventName {
				continue
			}
			attrs := attribute.NewSet(ev.Attributes...)
			d, _ := attrs.Value(otelidem.AttrDecision)
			events = append(events, s.Name()+" "+d.AsString())
			if d.AsString() == "executed" {
				for _, k := range []attribute.Key{otelidem.AttrRecordID, otelidem.AttrKey, otelidem.AttrStatus, otelidem.MetricClaimDuration, otelidem.MetricCompletionDuration} {
					if _, ok := attrs.Value(k); !ok {
						t.Errorf("executed event without %s: %v", k, ev.Attributes)
					}
				}
			}
			if d.AsString() == "mismatch" {
				if v, _ := attrs.Value(otelidem.AttrStatus); v.AsInt64() != 422 {
					t.Errorf("mismatch event status %v, want 422", v)
				}
			}
		}
	}
	for _, w := range []string{"POST /orders executed", "POST /orders replayed", "POST /orders mismatch", "POST /orders invalid", "POST /slow in_progress", "POST /slow executed"} {
		if !contains(events, w) {
			t.Errorf("span events %v: no %q", events, w)
		}
	}
}

func contains(xs []string, x string) bool {
	for _, v := range xs {
		if v == x {
			return true
		}
	}
	return false
}

func TestStoreErrors(t *testing.T) {
	// Rule: a store that fails is counted as store_error, with its claim
	// time; the span event carries the error for the operator.
	f, _ := newFixture(t, downStore{memstore.New()})
	if got := f.post(t, "/orders", "k", `{}`); got != http.StatusServiceUnavailable {
		t.Fatalf("status %d, want 503", got)
	}
	got, _, _ := f.collect(t)
	if got[otelidem.MetricDecisions]["store_error"] != 1 || got[otelidem.MetricClaimDuration]["store_error"] != 1 {
		t.Fatalf("metrics %v, want one store_error with its claim time", got)
	}
	spans := f.spans.Ended()
	if len(spans) != 1 || len(spans[0].Events()) != 1 {
		t.Fatalf("spans %v", spans)
	}
	attrs := attribute.NewSet(spans[0].Events()[0].Attributes...)
	if v, ok := attrs.Value(otelidem.AttrError); !ok || !strings.Contains(v.AsString(), "unavailable") {
		t.Errorf("store error event without its error: %v", spans[0].Events()[0].Attributes)
	}
}

func TestRouteNeverThePath(t *testing.T) {
	// Rule: metrics and span events carry the route pattern (idem.route),
	// bounded: a protected handler that is not a ServeMux route has no
	// pattern, and its decisions carry no idem.route, never the concrete
	// path; the scope is the core.Scope name.
	f, obs := newFixture(t, memstore.New())
	e, err := core.New(memstore.New(), core.WithSingleCaller(), core.WithObserver(obs))
	if err != nil {
		t.Fatal(err)
	}
	h := e.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusCreated) }), core.Scope("refunds"))
	for _, path := range []string{"/orders/1/refunds", "/orders/2/refunds"} {
		req := httptest.NewRequest(http.MethodPost, path, strings.NewReader(`{}`))
		req.Header.Set(core.HeaderKey, path)
		h.ServeHTTP(httptest.NewRecorder(), req)
	}
	got, scopes, routes := f.collect(t)
	if got[otelidem.MetricDecisions]["executed"] != 2 || len(scopes) != 1 || !scopes["refunds"] {
		t.Fatalf("metrics %v, scopes %v; want two executed under the scope refunds", got, scopes)
	}
	if len(routes) != 1 || !routes["-"] {
		t.Errorf("routes %v: without a route pattern the metrics must carry no idem.route", routes)
	}
}

// The completer's and an operator's decisions are counted by kind like
// every other: an indeterminate payment settled by the completer without
// a client ("settled"), one the completer cannot settle left for the
// operator after its ceiling ("left"), and the operator's release
// ("operator_released").
func TestCompleterAndOperatorDecisions(t *testing.T) {
	f, obs := newFixture(t, memstore.New())
	now := time.Date(2026, 3, 1, 9, 0, 0, 0, time.UTC)
	var mu sync.Mutex
	clock := func() time.Time { // a millisecond passes at every reading
		mu.Lock()
		defer mu.Unlock()
		now = now.Add(time.Millisecond)
		return now
	}
	e, err := core.New(memstore.New(), core.WithSingleCaller(), core.WithClock(clock), core.WithObserver(obs),
		core.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
	if err != nil {
		t.Fatal(err)
	}
	charged := map[string]bool{"a": true}
	h := e.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_ = core.MarkEffect(r.Context())
		w.WriteHeader(http.StatusBadGateway)
	}), core.Name("payments"), core.RecordRequest(nil), core.WithResolver(func(ctx context.Context, rec store.Record) (core.Resolution, error) {
		req, _ := core.ResolvingRequest(ctx)
		if charged[string(req.Body)] {
			return core.Resolution{Outcome: core.OutcomeApplied, Response: &core.Response{Status: 201}}, nil
		}
		return core.Resolution{}, nil
	}))
	for _, body := range []string{"a", "b"} {
		r := httptest.NewRequest(http.MethodPost, "/payments", strings.NewReader(body))
		r.Header.Set(core.HeaderKey, "k-"+body)
		h.ServeHTTP(httptest.NewRecorder(), r)
	}
	c := e.Completer()
	c.MaxTries, c.Backoff, c.MaxBackoff = 1, time.Minute, time.Minute
	for range 3 {
		mu.Lock()
		now = now.Add(time.Hour)
		mu.Unlock()
		if _, err := c.Complete(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	page, err := e.Records(context.Background(), admin.Query{})
	if err != nil || len(page.Records) != 1 {
		t.Fatalf("records left: %+v, %v", page, err)
	}
	if err := e.ReleaseRecord(context.Background(), mustID(t, page.Records[0].ID), "no charge"); err != nil {
		t.Fatal(err)
	}
	got, _, _ := f.collect(t)
	for _, d := range []string{"settled", "left", "operator_released"} {
		if got[otelidem.MetricDecisions][d] != 1 {
			t.Errorf("%s counted %d times, want 1 (%v)", d, got[otelidem.MetricDecisions][d], got[otelidem.MetricDecisions])
		}
	}
}

func mustID(t *testing.T, s string) store.ID {
	t.Helper()
	id, err := store.ParseID(s)
	if err != nil {
		t.Fatal(err)
	}
	return id
}
