package core_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/memstore"
	"github.com/idemkit/idem/core/store"
)

// TestRouteResolver: a route's own WithResolver settles the route's
// indeterminate records instead of the engine's resolver; routes without
// one keep the engine's.
func TestRouteResolver(t *testing.T) {
	engineCalls := 0
	e, err := core.New(memstore.New(), core.WithSingleCaller(), quiet,
		core.WithResolver(func(context.Context, store.Record) (core.Resolution, error) {
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
	settled := core.WithResolver(func(_ context.Context, rec store.Record) (core.Resolution, error) {
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

// TestResolverUnresolvedWhileAnotherSettles: a duplicate reads an
// indeterminate record and asks the route's resolver, which cannot tell
// yet; meanwhile another settler (a replica's completer running the
// recorded request again, core.Finish) released the record and claimed it
// for its own attempt. The duplicate must answer from what the record is
// now (in progress: ErrInProgress, retry later), not replay the 5xx it
// read before, which tells the client that nobody knows whether the
// payment ran while it is being run.
func TestResolverUnresolvedWhileAnotherSettles(t *testing.T) {
	st := memstore.New()
	e, err := core.New(st, core.WithSingleCaller(), quiet)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	m := core.Message{Consumer: "payments", ID: "m1"}
	charge := func(ctx context.Context) ([]byte, error) {
		if err := core.MarkEffect(ctx); err != nil {
			return nil, err
		}
		return nil, errors.New("the provider timed out")
	}
	if _, err := e.Once(ctx, m, charge); err == nil {
		t.Fatal("the first run must fail")
	}
	asked := 0
	otherSettler := core.WithResolver(func(ctx context.Context, rec store.Record) (core.Resolution, error) {
		asked++
		if asked == 1 {
			// Another settler found it not applied, released it and now
			// runs it again under a token of its own.
			if err := st.Release(ctx, rec.ID, rec.Token); err != nil {
				t.Errorf("release: %v", err)
			}
			now := time.Now()
			res, err := st.Claim(ctx, store.ClaimRequest{ID: rec.ID, Caller: rec.Caller, Scope: rec.Scope, Key: rec.Key,
				Fingerprint: rec.Fingerprint, Token: 424242, Now: now, LeaseUntil: now.Add(time.Minute), ExpiresAt: now.Add(time.Hour)})
			if err != nil || !res.Claimed {
				t.Errorf("the other settler's claim: %+v, %v", res, err)
			}
		}
		return core.Resolution{Outcome: core.OutcomeUnresolved}, nil
	})
	_, err = e.Once(ctx, m, charge, otherSettler)
	if !errors.Is(err, core.ErrInProgress) {
		t.Fatalf("a duplicate while another settler runs the record: %v, want ErrInProgress (not the stale indeterminate answer)", err)
	}
}
