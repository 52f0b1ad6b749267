package otelidem

import (
	"context"
	"fmt"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemkit/idem/core/observe"
	"github.com/idemkit/idem/core/store"
)

// ScopeName is the instrumentation scope of the meter.
const ScopeName = "github.com/idemkit/idem/otelidem"

// Metric names (see the README for their attributes).
const (
	MetricDecisions          = "idem.decisions"           // counter, {decision}
	MetricDuration           = "idem.duration"            // histogram, s: request start to decision
	MetricClaimDuration      = "idem.claim.duration"      // histogram, s: the claim
	MetricCompletionDuration = "idem.completion.duration" // histogram, s: recording the outcome
)

// Attribute keys.
const (
	AttrDecision = attribute.Key("idem.decision") // executed, replayed, in_progress, mismatch, ...
	AttrScope    = attribute.Key("idem.scope")    // the record's scope: a core.Scope name, "consumer mailer" (Engine.Once), "" by default
	AttrRoute    = attribute.Key("idem.route")    // the route pattern (observe.Event.Route): "/orders/:id", "/pkg.Service/Method"; absent when unknown
	// Span events only:
	AttrRecordID = attribute.Key("idem.record_id") // the record's ID, as in problem documents and logs
	AttrKey      = attribute.Key("idem.key")       // the key, hashed unless core.WithRawKeysInLogs
	AttrAttempt  = attribute.Key("idem.attempt")   // the record's attempt number
	AttrStatus   = attribute.Key("idem.status")    // the (HTTP, or HTTP-equivalent) status answered
	AttrError    = attribute.Key("idem.error")     // the error behind a rejection or failure
)

// EventName is the name of the span event added for every decision.
const EventName = "idem.decision"

// durationBuckets are the histograms' bucket bounds, in seconds: from
// half a millisecond (a claim on a local database) to ten seconds.
var durationBuckets = []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10}

// Option configures New.
type Option interface{ apply(*config) }

type option func(*config)

func (f option) apply(c *config) { f(c) }

type config struct {
	mp metric.MeterProvider
}

// WithMeterProvider sets the meter provider (default
// otel.GetMeterProvider(), the global one).
func WithMeterProvider(mp metric.MeterProvider) Option {
	return option(func(c *config) { c.mp = mp })
}

// New returns an observer for core.WithObserver that records every
// decision of the engine as metrics (MetricDecisions and the duration
// histograms) and as a span event (EventName) on the span of the
// request's context, when one is recording (the span of otelhttp,
// otelgin, otelecho or otelgrpc).
func New(opts ...Option) (observe.Observer, error) {
	var c config
	for _, o := range opts {
		o.apply(&c)
	}
	if c.mp == nil {
		c.mp = otel.GetMeterProvider()
	}
	m := c.mp.Meter(ScopeName)
	o := &observer{}
	var err error
	if o.decisions, err = m.Int64Counter(MetricDecisions, metric.WithUnit("{decision}"),
		metric.WithDescription("Decisions of the idempotency engine, by kind (idem.decision): executed, replayed, in_progress, mismatch, released, indeterminate, resolved, lease_lost, store_error, invalid; the completer's settled, settle_released, finished, left, settle_error; an operator's operator_resolved, operator_released.")); err != nil {
		return nil, fmt.Errorf("otelidem: %w", err)
	}
	if o.duration, err = m.Float64Histogram(MetricDuration, metric.WithUnit("s"), metric.WithExplicitBucketBoundaries(durationBuckets...),
		metric.WithDescription("Time from the start of a request to the engine's decision, the handler included when it ran.")); err != nil {
		return nil, fmt.Errorf("otelidem: %w", err)
	}
	if o.claim, err = m.Float64Histogram(MetricClaimDuration, metric.WithUnit("s"), metric.WithExplicitBucketBoundaries(durationBuckets...),
		metric.WithDescription("Time the claim of a record took: the store's answer, with BEGIN in atomic mode and any WaitInFlight wait.")); err != nil {
		return nil, fmt.Errorf("otelidem: %w", err)
	}
	if o.completion, err = m.Float64Histogram(MetricCompletionDuration, metric.WithUnit("s"), metric.WithExplicitBucketBoundaries(durationBuckets...),
		metric.WithDescription("Time recording an outcome took: the completion or release, with COMMIT or ROLLBACK in atomic mode.")); err != nil {
		return nil, fmt.Errorf("otelidem: %w", err)
	}
	return o.observe, nil
}

type observer struct {
	decisions                   metric.Int64Counter
	duration, claim, completion metric.Float64Histogram
}

func (o *observer) observe(ctx context.Context, ev observe.Event) {
	// Every attribute is bounded: the scope is a name written by hand (or
	// empty), the route a pattern of the router (never the concrete path).
	attrs := []attribute.KeyValue{AttrDecision.String(string(ev.Decision)), AttrScope.String(ev.Scope)}
	if ev.Route != "" {
		attrs = append(attrs, AttrRoute.String(ev.Route))
	}
	set := metric.WithAttributeSet(attribute.NewSet(attrs...))
	o.decisions.Add(ctx, 1, set)
	o.duration.Record(ctx, ev.Duration.Seconds(), set)
	if ev.Claim > 0 {
		o.claim.Record(ctx, ev.Claim.Seconds(), set)
	}
	if ev.Complete > 0 {
		o.completion.Record(ctx, ev.Complete.Seconds(), set)
	}

	span := trace.SpanFromContext(ctx)
	if !span.IsRecording() {
		return
	}
	// A new slice: attribute.NewSet sorted attrs in place.
	attrs = []attribute.KeyValue{AttrDecision.String(string(ev.Decision)), AttrScope.String(ev.Scope)}
	if ev.Route != "" {
		attrs = append(attrs, AttrRoute.String(ev.Route))
	}
	if ev.ID != (store.ID{}) {
		attrs = append(attrs, AttrRecordID.String(ev.ID.String()))
	}
	if ev.Key != "" {
		attrs = append(attrs, AttrKey.String(ev.Key))
	}
	if ev.Attempt > 0 {
		attrs = append(attrs, AttrAttempt.Int(ev.Attempt))
	}
	if ev.Status != 0 {
		attrs = append(attrs, AttrStatus.Int(ev.Status))
	}
	if ev.Claim > 0 {
		attrs = append(attrs, attribute.Float64(MetricClaimDuration, ev.Claim.Seconds()))
	}
	if ev.Complete > 0 {
		attrs = append(attrs, attribute.Float64(MetricCompletionDuration, ev.Complete.Seconds()))
	}
	if ev.Err != nil {
		attrs = append(attrs, AttrError.String(ev.Err.Error()))
	}
	span.AddEvent(EventName, trace.WithAttributes(attrs...))
}
