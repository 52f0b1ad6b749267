package redisstore_test

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/store"
	"github.com/idemkit/idem/redisstore"
)

var epoch = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)

func id(name string) store.ID { return sha256.Sum256([]byte("redisstore " + name)) }

func claim(i store.ID, token int64, now time.Time) store.ClaimRequest {
	return store.ClaimRequest{ID: i, Token: token, Now: now, LeaseUntil: now.Add(30 * time.Second), ExpiresAt: now.Add(time.Hour), Fingerprint: []byte("fp")}
}

// keyOf returns the key of record i under the store's prefix, found by
// scanning (the tests do not know the store's prefix otherwise).
func keyOf(t *testing.T, c *redis.Client, i store.ID) string {
	t.Helper()
	keys, err := c.Keys(context.Background(), "*{"+i.String()+"}").Result()
	if err != nil || len(keys) != 1 {
		t.Fatalf("keys of %s: %v %v, want one", i, keys, err)
	}
	return keys[0]
}

// wantTTL fails t unless key's remaining time is d, within a second.
func wantTTL(t *testing.T, c *redis.Client, key string, d time.Duration) {
	t.Helper()
	got, err := c.PTTL(context.Background(), key).Result()
	if err != nil {
		t.Fatal(err)
	}
	if diff := got - d; diff > time.Second || diff < -time.Second {
		t.Errorf("PTTL %s = %v, want %v", key, got, d)
	}
}

// TestKeyExpiry: a record's key expires by the server's clock a minute
// after its ExpiresAt, counted from the caller's Now at the claim (so a
// caller's clock that is off, here by years, neither drops the record
// early nor keeps it for ever), and moves as ExpiresAt moves; a
// completion that expired more than a minute ago deletes the key.
func TestKeyExpiry(t *testing.T) {
	c := client(t)
	s := newStore(t, c)
	ctx := t.Context()
	rid := id("ttl")
	req := claim(rid, 7, epoch)
	if res, err := s.Claim(ctx, req); err != nil || !res.Claimed {
		t.Fatalf("Claim: %+v %v", res, err)
	}
	key := keyOf(t, c, rid)
	wantTTL(t, c, key, time.Hour+time.Minute)
	if err := s.Extend(ctx, rid, 7, epoch.Add(2*time.Hour)); err != nil {
		t.Fatal(err)
	}
	wantTTL(t, c, key, 2*time.Hour+time.Minute)
	if err := s.Complete(ctx, rid, 7, store.Completion{State: store.StateCompleted, Status: 201, ExpiresAt: epoch.Add(24 * time.Hour)}); err != nil {
		t.Fatal(err)
	}
	wantTTL(t, c, key, 24*time.Hour+time.Minute)

	gone := id("ttl gone")
	if _, err := s.Claim(ctx, claim(gone, 8, epoch)); err != nil {
		t.Fatal(err)
	}
	if err := s.Complete(ctx, gone, 8, store.Completion{State: store.StateCompleted, Status: 201, ExpiresAt: epoch.Add(-2 * time.Minute)}); err != nil {
		t.Fatal(err)
	}
	if n, err := c.Exists(ctx, keyOf(t, c, rid)[:len(key)-66]+"{"+gone.String()+"}").Result(); err != nil || n != 0 {
		t.Errorf("a record completed with ExpiresAt two minutes before the claim's Now: key exists (%d, %v), want deleted", n, err)
	}
}

// doubler resends every script once after it ran, as a client does whose
// first reply was lost (a timeout, a reset connection): the second run
// sees the first one's write.
type doubler struct{}

func (doubler) DialHook(next redis.DialHook) redis.DialHook { return next }
func (doubler) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (doubler) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if err := next(ctx, cmd); err != nil || !strings.HasPrefix(cmd.Name(), "eval") {
			return err
		}
		return next(ctx, cmd)
	}
}

// TestResentWrites: a write whose script runs twice (a resend after a
// lost reply) answers as the first run did: the claim is the caller's,
// the completion done, the release a no-op; never ErrFenced for the
// caller's own write.
func TestResentWrites(t *testing.T) {
	c := client(t)
	d := redis.NewClient(&redis.Options{Addr: c.Options().Addr})
	t.Cleanup(func() { d.Close() })
	d.AddHook(doubler{})
	s := newStore(t, d)
	ctx := t.Context()
	for i, final := range []store.State{store.StateCompleted, store.StateIndeterminate} {
		rid := id(fmt.Sprint("resent ", i))
		res, err := s.Claim(ctx, claim(rid, 11, epoch))
		if err != nil || !res.Claimed || res.Record.Attempt != 1 {
			t.Fatalf("resent Claim: %+v %v, want claimed at attempt 1", res, err)
		}
		if err := s.Extend(ctx, rid, 11, epoch.Add(time.Minute)); err != nil {
			t.Fatalf("resent Extend: %v", err)
		}
		if err := s.Complete(ctx, rid, 11, store.Completion{State: final, Status: 201, Response: []byte("r"), ExpiresAt: epoch.Add(time.Hour)}); err != nil {
			t.Fatalf("resent Complete (%v): %v", final, err)
		}
		rec, err := s.Get(ctx, rid, epoch)
		if err != nil || rec.State != final || string(rec.Response) != "r" {
			t.Fatalf("Get after the resent Complete: %+v %v", rec, err)
		}
		// Another call of the same token is still refused.
		if err := s.Complete(ctx, rid, 11, store.Completion{State: store.StateCompleted, Status: 200, ExpiresAt: epoch.Add(time.Hour)}); final == store.StateCompleted && !errors.Is(err, core.ErrFenced) {
			t.Errorf("a second Complete of a completed record: %v, want ErrFenced", err)
		}
	}
	rid := id("resent release")
	if _, err := s.Claim(ctx, claim(rid, 12, epoch)); err != nil {
		t.Fatal(err)
	}
	if err := s.Release(ctx, rid, 12); err != nil {
		t.Fatalf("resent Release: %v", err)
	}
	if _, err := s.Get(ctx, rid, epoch); !errors.Is(err, core.ErrNotFound) {
		t.Fatalf("Get after Release: %v, want ErrNotFound", err)
	}
}

// TestReplicasMissing: with WithReplicas on a server that has no
// replica, Check fails with ErrConfig, a claim fails with
// ErrStoreUnavailable and ErrNotReplicated and is released again (a retry
// claims afresh), and a completion fails likewise but stays on the
// primary (a retry replays it).
func TestReplicasMissing(t *testing.T) {
	c := client(t)
	prefix := "idemtest:wait:" + fmt.Sprint(time.Now().UnixNano()) + ":"
	t.Cleanup(func() { deleteKeys(t, c, prefix) })
	waiting, err := redisstore.New(c, redisstore.WithPrefix(prefix), redisstore.WithReplicas(1, 50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	plain, _ := redisstore.New(c, redisstore.WithPrefix(prefix))
	ctx := t.Context()
	if err := waiting.Check(ctx); !errors.Is(err, core.ErrConfig) {
		t.Errorf("Check with WithReplicas(1) and no replica: %v, want ErrConfig", err)
	}
	if err := plain.Check(ctx); err != nil {
		t.Errorf("Check without WithReplicas: %v", err)
	}
	rid := id("wait")
	_, err = waiting.Claim(ctx, claim(rid, 21, epoch))
	if !errors.Is(err, core.ErrStoreUnavailable) || !errors.Is(err, redisstore.ErrNotReplicated) {
		t.Fatalf("Claim with no replica to acknowledge it: %v, want ErrStoreUnavailable and ErrNotReplicated", err)
	}
	if _, err := plain.Get(ctx, rid, epoch); !errors.Is(err, core.ErrNotFound) {
		t.Fatalf("Get after the claim that was not replicated: %v, want ErrNotFound (released again)", err)
	}
	if res, err := plain.Claim(ctx, claim(rid, 22, epoch)); err != nil || !res.Claimed {
		t.Fatalf("a retry's Claim: %+v %v, want claimed", res, err)
	}
	err = waiting.Complete(ctx, rid, 22, store.Completion{State: store.StateCompleted, Status: 201, ExpiresAt: epoch.Add(time.Hour)})
	if !errors.Is(err, core.ErrStoreUnavailable) || !errors.Is(err, redisstore.ErrNotReplicated) {
		t.Fatalf("Complete with no replica: %v, want ErrStoreUnavailable and ErrNotReplicated", err)
	}
	if rec, err := plain.Get(ctx, rid, epoch); err != nil || rec.State != store.StateCompleted {
		t.Fatalf("Get after the completion that was not replicated: %+v %v, want it completed on the primary", rec, err)
	}
}

// TestNow: Now is the server's clock (the test server runs on this
// machine, so it agrees with the local clock within a second).
func TestNow(t *testing.T) {
	s := newStore(t, client(t))
	now, err := s.Now(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if d := time.Since(now); d > time.Second || d < -time.Second {
		t.Fatalf("Now = %v, %v from the local clock", now, d)
	}
}
