package core_test

import (
	"context"
	"errors"
	"testing"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/memstore"
)

// TestRouteResolver: a route's own WithResolver settles the route's
// indeterminate records instead of the engine's resolver; routes without
// one keep the engine's.
func TestRouteResolver(t *testing.T) {
	engineCalls := 0
	e, err := core.New(memstore.New(), core.WithSingleCaller(), quiet,
		core.WithResolver(func(context.Context, core.Record) (core.Resolution, error) {
			engineCalls++
			return core.Resolution{Outcome: core.OutcomeUnresolved}, nil
		}))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	m := core.Message{Consumer: "payments", ID: "m1"}
	ran := 0
	charge := func(ctx context.Context) ([]byte, error) {
		ran++
		if err := core.MarkEffect(ctx); err != nil {
			return nil, err
		}
		return nil, errors.New("the provider timed out")
	}
	if _, err := e.Once(ctx, m, charge); err == nil {
		t.Fatal("the first run must fail")
	}
	// The engine's resolver leaves the record indeterminate.
	if _, err := e.Once(ctx, m, charge); !errors.Is(err, core.ErrIndeterminate) {
		t.Fatalf("with the engine's resolver: %v, want ErrIndeterminate", err)
	}
	if engineCalls != 1 {
		t.Fatalf("the engine's resolver was asked %d times, want 1", engineCalls)
	}
	// The route's own resolver is asked instead, and settles it.
	routeCalls := 0
	settled := core.WithResolver(func(_ context.Context, rec core.Record) (core.Resolution, error) {
		routeCalls++
		return core.Resolution{Outcome: core.OutcomeApplied, Response: &core.Response{Status: 200, Body: []byte("charged"), BodyKept: true}}, nil
	})
	res, err := e.Once(ctx, m, charge, settled)
	if err != nil || !res.Replayed || string(res.Value) != "charged" {
		t.Fatalf("with the route's resolver: %+v, %v; want the resolver's value, replayed", res, err)
	}
	if routeCalls != 1 || engineCalls != 1 || ran != 1 {
		t.Fatalf("route resolver asked %d times, engine's %d, fn ran %d times; want 1, 1, 1", routeCalls, engineCalls, ran)
	}
}
