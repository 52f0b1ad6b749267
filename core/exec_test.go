package core_test

import (
	"context"
	"errors"
	"log/slog"
	"testing"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/memstore"
	"github.com/idemkit/idem/core/store"
)

// downStore's claims fail as an unreachable database's do.
type downStore struct{ store.Store }

func (downStore) Claim(context.Context, store.ClaimRequest) (store.ClaimResult, error) {
	return store.ClaimResult{}, errors.New("dial tcp: connection refused")
}

// TestExec: Route.Exec, the entry of transports other than HTTP, keeps
// the HTTP rules: the key is required and parsed, the caller named, a
// completed record replayed with its headers, a different fingerprint
// refused, a 5xx released, and a rejection that HTTP answers with
// Retry-After comes as a *RetryError.
func TestExec(t *testing.T) {
	e, err := core.New(memstore.New(), core.WithSingleCaller())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	runs, protected := 0, 0
	status := 201
	fn := func(ctx context.Context) *core.Response {
		runs++
		if _, ok := core.AttemptFrom(ctx); ok {
			protected++
		}
		return &core.Response{Status: status, Header: map[string][]string{"h:location": {"/orders/1"}}, Body: []byte("order 1")}
	}
	caller := func(context.Context) (string, error) { return "acct_1", nil }
	fp := func(b string) func() ([]byte, error) { return func() ([]byte, error) { return []byte(b), nil } }
	rt := e.Route()
	req := core.Request{Key: []string{"k1"}, Caller: caller, Route: "/s.S/M", Fingerprint: fp("a")}

	resp, replayed, err := rt.Exec(ctx, req, fn)
	if err != nil || replayed || resp.Status != 201 || runs != 1 {
		t.Fatalf("first: %+v %v %v (runs %d)", resp, replayed, err, runs)
	}
	resp, replayed, err = rt.Exec(ctx, req, fn)
	if err != nil || !replayed || resp.Status != 201 || string(resp.Body) != "order 1" || resp.Header["h:location"][0] != "/orders/1" || runs != 1 {
		t.Fatalf("replay: %+v %v %v (runs %d)", resp, replayed, err, runs)
	}
	other := req
	other.Fingerprint = fp("b")
	if _, _, err := rt.Exec(ctx, other, fn); !errors.Is(err, core.ErrMismatch) {
		t.Fatalf("other fingerprint: %v, want ErrMismatch", err)
	}

	for name, tc := range map[string]struct {
		req  core.Request
		want error
	}{
		"MissingKey": {core.Request{Caller: caller, Route: "/s.S/M"}, core.ErrMissingKey},
		"KeyTwice":   {core.Request{Key: []string{"a", "b"}, Caller: caller, Route: "/s.S/M"}, core.ErrInvalidKey},
		"NoCaller":   {core.Request{Key: []string{"k"}, Caller: func(context.Context) (string, error) { return "", nil }, Route: "/s.S/M"}, core.ErrNoCaller},
		"BadFingerprint": {core.Request{Key: []string{"k"}, Caller: caller, Route: "/s.S/M",
			Fingerprint: func() ([]byte, error) { return nil, errors.New("not a message") }}, core.ErrInvalidRequest},
	} {
		if _, _, err := rt.Exec(ctx, tc.req, fn); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", name, err, tc.want)
		}
	}
	if runs != 1 {
		t.Fatalf("fn ran %d times for refused requests", runs-1)
	}

	status = 503
	req.Key = []string{"k2"}
	for i := range 2 {
		if resp, replayed, err := rt.Exec(ctx, req, fn); err != nil || replayed || resp.Status != 503 {
			t.Fatalf("5xx %d: %+v %v %v", i, resp, replayed, err)
		}
	}
	if runs != 3 {
		t.Fatalf("a 5xx was not released: fn ran %d times, want 3", runs)
	}

	down, err := core.New(downStore{memstore.New()}, core.WithSingleCaller(), core.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	_, _, err = down.Route().Exec(ctx, req, fn)
	var re *core.RetryError
	if !errors.Is(err, core.ErrStoreUnavailable) || !errors.As(err, &re) || re.RetryAfter != core.DefaultRetryAfter {
		t.Fatalf("store down: %v, want ErrStoreUnavailable in a RetryError of %v", err, core.DefaultRetryAfter)
	}
	if protected != runs {
		t.Fatalf("fn ran %d times, %d of them with its attempt in the context", runs, protected)
	}
	if _, _, err := down.Route(core.KeyOptional()).Exec(ctx, core.Request{Route: "/s.S/M"}, fn); err != nil || runs != 4 || protected != 3 {
		t.Fatalf("KeyOptional without a key: %v (runs %d, protected %d), want an unprotected run", err, runs, protected)
	}
}
