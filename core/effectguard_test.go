package core_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/admin"
	"github.com/idemkit/idem/core/memstore"
	"github.com/idemkit/idem/core/store"
)

// The effect guard (core.MarkEffect in atomic mode): MarkEffect commits a
// guard outside the attempt's transaction before the effect, so that an
// attempt whose transaction ended without the engine (the session killed,
// the COMMIT lost with the database out of reach) leaves the effect known.
// A later attempt that meets an earlier attempt's guard does not run the
// effect: its MarkEffect fails with ErrIndeterminate and the record is
// indeterminate whatever it answers. A release by an operator removes the
// guard. (sqlstore/dbtest's TestEffectGuard* drive the real failures on
// Postgres and MariaDB.)
func TestEffectGuard(t *testing.T) {
	ms := memstore.New()
	st := ms.Atomic()
	e, err := core.New(st, core.WithSingleCaller(), quiet)
	if err != nil {
		t.Fatal(err)
	}
	var charges atomic.Int32
	var markErr atomic.Value
	pay := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := core.MarkEffect(r.Context()); err != nil {
			markErr.Store(err)
			if !strings.Contains(r.Header.Get(core.HeaderKey), "ignores") {
				http.Error(w, "not charged", http.StatusBadGateway)
				return
			}
		}
		charges.Add(1)
		w.WriteHeader(http.StatusCreated)
	})
	h := e.Handler(pay)
	ctx := context.Background()
	now := time.Now()
	find := func(key string) store.Record {
		t.Helper()
		for _, state := range []store.State{store.StateCompleted, store.StateIndeterminate, store.StateInProgress} {
			recs, err := st.List(ctx, store.ListQuery{State: state, Now: time.Now(), Limit: 100})
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range recs {
				if r.Key == key {
					return r
				}
			}
		}
		t.Fatalf("no record of key %q", key)
		return store.Record{}
	}

	// A first execution writes the guard under its own token, held until
	// the record expires.
	if w := post(h, "first"); w.Code != http.StatusCreated {
		t.Fatalf("first: %d %s", w.Code, w.Body)
	}
	rec := find("first")
	g, err := st.Get(ctx, rec.ID.EffectGuard(), now)
	if err != nil {
		t.Fatalf("the guard of a marked atomic attempt: %v, want it written", err)
	}
	if g.Token != rec.Token || g.State != store.StateInProgress || !g.ExpiresAt.Equal(rec.ExpiresAt) || g.Key != rec.Key {
		t.Fatalf("guard %+v, want in progress under the record's token %d and key, expiring with it (%v)", g, rec.Token, rec.ExpiresAt)
	}
	if page, err := e.Records(ctx, admin.Query{State: store.StateInProgress}); err != nil || len(page.Records) != 0 {
		t.Fatalf("the operator's listing of records in progress: %+v %v, want no guard in it", page.Records, err)
	}

	// An earlier attempt's guard, and no record (its transaction never
	// committed): the retry does not charge, and is indeterminate, also
	// when its handler ignores MarkEffect's error and answers 201.
	for _, key := range []string{"lost", "lost-ignores"} {
		t.Run(key, func(t *testing.T) {
			id := store.Identity{Caller: rec.Caller, Scope: rec.Scope, Key: key}.ID()
			if _, err := st.Claim(ctx, store.ClaimRequest{ID: id.EffectGuard(), Caller: rec.Caller, Scope: rec.Scope, Key: key,
				Token: 4242, Now: now, LeaseUntil: now.Add(time.Hour), ExpiresAt: now.Add(time.Hour)}); err != nil {
				t.Fatal(err)
			}
			before := charges.Load()
			w := post(h, key)
			if err, _ := markErr.Load().(error); !errors.Is(err, core.ErrIndeterminate) {
				t.Fatalf("MarkEffect: %v, want an error wrapping ErrIndeterminate", err)
			}
			if w.Code != http.StatusInternalServerError || !strings.Contains(w.Body.String(), "outcome-unknown") {
				t.Fatalf("retry after a lost attempt: %d %s, want 500 outcome-unknown", w.Code, w.Body)
			}
			again := post(h, key)
			if again.Code != http.StatusInternalServerError || again.Header().Get(core.HeaderReplayed) != "true" {
				t.Fatalf("the next retry: %d %s, want the indeterminate answer replayed", again.Code, again.Body)
			}
			if key == "lost" && charges.Load() != before {
				t.Fatalf("%d charges, want none: an earlier attempt's effect may have happened", charges.Load()-before)
			}
			if r := find(key); r.State != store.StateIndeterminate {
				t.Fatalf("record %v, want indeterminate", r.State)
			}
		})
	}

	// The operator releases the record (the effect did not happen): the
	// guard goes with it and the next attempt charges.
	lost := find("lost")
	if err := e.ReleaseRecord(ctx, lost.ID, "the provider has no charge for it"); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Get(ctx, lost.ID.EffectGuard(), time.Now()); !errors.Is(err, core.ErrNotFound) {
		t.Fatalf("the guard after a release: %v, want it gone", err)
	}
	before := charges.Load()
	if w := post(h, "lost"); w.Code != http.StatusCreated || charges.Load() != before+1 {
		t.Fatalf("after the release: %d %s (%d charges), want 201 and one charge", w.Code, w.Body, charges.Load()-before)
	}

	// Leased mode needs no guard: its claim commits before the handler.
	if w := post(e.Handler(pay, core.Leased(), core.Scope("leased")), "leased"); w.Code != http.StatusCreated {
		t.Fatalf("leased: %d %s", w.Code, w.Body)
	}
	if _, err := st.Get(ctx, find("leased").ID.EffectGuard(), time.Now()); !errors.Is(err, core.ErrNotFound) {
		t.Fatalf("a leased attempt's guard: %v, want none", err)
	}
}
