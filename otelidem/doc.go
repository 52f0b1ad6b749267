// Package otelidem records the decisions of idem's engine with
// OpenTelemetry: an observer for core.WithObserver that counts every
// decision by kind (idem.decisions), times claims, completions and whole
// requests (idem.claim.duration, idem.completion.duration, idem.duration),
// and adds an idem.decision event to the request's span.
//
//	obs, err := otelidem.New() // the global meter provider, or WithMeterProvider
//	e, err := core.New(store, core.WithCaller(caller), core.WithObserver(obs))
//
// Replays, in-flight conflicts, mismatches, lost leases and store errors
// are decisions: idem.decisions with idem.decision = replayed, in_progress,
// mismatch, lease_lost, store_error. The README lists every name and
// attribute and shows the path to Prometheus through the OpenTelemetry
// Prometheus exporter.
package otelidem
