package redisstore

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/store"
	"github.com/idemkit/idem/internal/debugtext"
)

// DefaultPrefix is the prefix of every key the store writes (WithPrefix).
const DefaultPrefix = "idem:"

// keyGrace is how long a record's key outlives its ExpiresAt: the record
// is absent from ExpiresAt on (Get and Claim compare it with the time they
// are given), and Redis deletes the key a minute later, so that a process
// whose clock runs a little behind the owner's still finds the record
// while it is live by its clock.
const keyGrace = time.Minute

// Store is an idem store on Redis for leased mode: store.Store and
// store.Inspector, not store.TxStore (Redis has no transaction a handler's
// writes could join, so an engine over it runs every route in leased
// mode, and a route that asks for atomic mode with core.Atomic fails when
// it is built). It is safe for concurrent use.
type Store struct {
	c        redis.UniversalClient
	prefix   string
	replicas int
	timeout  time.Duration
}

var (
	_ store.Store     = (*Store)(nil)
	_ store.Inspector = (*Store)(nil)
)

// Option configures a Store.
type Option interface{ apply(*Store) error }

type optionFunc func(*Store) error

func (f optionFunc) apply(s *Store) error { return f(s) }

// WithPrefix sets the prefix of the store's keys (default DefaultPrefix):
// a record's key is the prefix, then its ID in hex between braces (a hash
// tag), "idem:{9f86d0...}". Stores with different prefixes on one server
// never see each other's records. The prefix must not contain braces.
func WithPrefix(p string) Option {
	return optionFunc(func(s *Store) error {
		if strings.ContainsAny(p, "{}") {
			return fmt.Errorf("%w: redisstore: prefix %q contains a brace (the ID between braces is the key's hash tag)", core.ErrConfig, p)
		}
		s.prefix = p
		return nil
	})
}

// WithReplicas makes every write (Claim, Extend, Complete, Release) wait
// until n replicas have acknowledged it (WAIT n timeout) before it
// returns; the default, 0, waits for none: Redis replicates
// asynchronously, so a failover can lose a write it acknowledged. A write
// that fewer than n replicas acknowledged within timeout is on the primary
// but may or may not survive a failover: the method returns an error
// wrapping core.ErrStoreUnavailable (a claim is released again first, so
// that a retry claims afresh). See the README for what each setting
// survives. n must not be negative, timeout must be positive when n is
// not 0.
func WithReplicas(n int, timeout time.Duration) Option {
	return optionFunc(func(s *Store) error {
		switch {
		case n < 0:
			return fmt.Errorf("%w: redisstore: WithReplicas(%d): the number of replicas is negative", core.ErrConfig, n)
		case n > 0 && timeout <= 0:
			return fmt.Errorf("%w: redisstore: WithReplicas(%d, %v): the timeout must be positive (WAIT 0 would block for ever)", core.ErrConfig, n, timeout)
		}
		s.replicas, s.timeout = n, timeout
		return nil
	})
}

// New returns a store on c: a *redis.Client (one server, or a Sentinel
// failover client from redis.NewFailoverClient) or a *redis.ClusterClient.
// Every record is one key, so the store works unchanged on Redis Cluster.
// New does not contact the server; Check does.
func New(c redis.UniversalClient, opts ...Option) (*Store, error) {
	if c == nil {
		return nil, fmt.Errorf("%w: redisstore: nil client", core.ErrConfig)
	}
	s := &Store{c: c, prefix: DefaultPrefix}
	for _, o := range opts {
		if o == nil {
			continue
		}
		if err := o.apply(s); err != nil {
			return nil, err
		}
	}
	if _, ring := c.(*redis.Ring); ring && s.replicas > 0 {
		return nil, fmt.Errorf("%w: redisstore: WithReplicas needs a *redis.Client or a *redis.ClusterClient: a *redis.Ring cannot send WAIT on the connection of the write", core.ErrConfig)
	}
	return s, nil
}

// Check pings the server (every primary of a cluster) and, with
// WithReplicas(n, ...), fails unless each has at least n connected
// replicas, so that a misconfigured deployment fails at start-up rather
// than on every write. Errors wrap core.ErrStoreUnavailable (unreachable)
// or core.ErrConfig (too few replicas).
func (s *Store) Check(ctx context.Context) error {
	err := s.eachPrimary(ctx, func(ctx context.Context, c redis.Cmdable) error {
		if err := c.Ping(ctx).Err(); err != nil {
			return unavailable("check", err)
		}
		if s.replicas == 0 {
			return nil
		}
		info, err := c.Info(ctx, "replication").Result()
		if err != nil {
			return unavailable("check", err)
		}
		n := -1
		for line := range strings.SplitSeq(info, "\n") {
			if v, ok := strings.CutPrefix(strings.TrimSpace(line), "connected_slaves:"); ok {
				n, _ = strconv.Atoi(v)
			}
		}
		if n < s.replicas {
			return fmt.Errorf("%w: redisstore: WithReplicas(%d) but the primary has %d connected replicas", core.ErrConfig, s.replicas, n)
		}
		return nil
	})
	if err != nil && !errors.Is(err, core.ErrStoreUnavailable) && !errors.Is(err, core.ErrConfig) {
		return unavailable("check", err)
	}
	return err
}

// key is the record's key: the prefix and the ID in hex as a hash tag.
func (s *Store) key(id store.ID) string { return s.prefix + "{" + id.String() + "}" }

// Claim implements store.Store with one script on the record's key.
func (s *Store) Claim(ctx context.Context, req store.ClaimRequest) (store.ClaimResult, error) {
	ttl := req.ExpiresAt.Sub(req.Now) + keyGrace
	takeover := "0"
	if req.Takeover {
		takeover = "1"
	}
	key := s.key(req.ID)
	v, waitErr := s.write(ctx, claimScript, key,
		us(req.Now), strconv.FormatInt(req.Token, 10), us(req.LeaseUntil), us(req.ExpiresAt),
		max(ttl.Milliseconds(), 1), takeover, req.Fingerprint,
		debugtext.Clean(req.Caller), debugtext.Clean(req.Scope), debugtext.Clean(req.Key))
	if v == nil {
		return store.ClaimResult{}, waitErr
	}
	out, ok := v.([]any)
	if !ok || len(out) != 2 {
		return store.ClaimResult{}, unavailable("claim", fmt.Errorf("unexpected reply %v", v))
	}
	outcome, _ := out[0].(int64)
	fields, _ := out[1].([]any)
	rec, err := decodePairs(req.ID, fields)
	if err != nil {
		return store.ClaimResult{}, unavailable("claim", err)
	}
	claimed := outcome != 0
	if waitErr != nil && claimed {
		// Not replicated as asked: nothing ran under this claim yet, so
		// release it again (best effort) for a retry to claim afresh
		// instead of waiting out the lease. (A refused claim wrote
		// nothing: its WAIT says nothing about the record it read.)
		_ = releaseScript.Run(context.WithoutCancel(ctx), s.c, []string{key}, strconv.FormatInt(req.Token, 10)).Err()
		return store.ClaimResult{}, waitErr
	}
	return store.ClaimResult{Claimed: claimed, Record: rec}, nil
}

// Extend implements store.Store.
func (s *Store) Extend(ctx context.Context, id store.ID, token int64, leaseUntil time.Time) error {
	return s.fenced("extend", id, token)(s.write(ctx, extendScript, s.key(id), strconv.FormatInt(token, 10), us(leaseUntil)))
}

// Complete implements store.Store. The response is sent as it is and kept
// byte for byte (the engine bounds and seals it; see core.WithSealer).
func (s *Store) Complete(ctx context.Context, id store.ID, token int64, c store.Completion) error {
	var nonce [8]byte
	_, _ = rand.Read(nonce[:])
	return s.fenced("complete", id, token)(s.write(ctx, completeScript, s.key(id),
		strconv.FormatInt(token, 10), strconv.Itoa(int(c.State)), strconv.Itoa(c.Status), c.Response, us(c.ExpiresAt),
		strconv.FormatUint(binary.BigEndian.Uint64(nonce[:]), 16)))
}

// Release implements store.Store.
func (s *Store) Release(ctx context.Context, id store.ID, token int64) error {
	return s.fenced("release", id, token)(s.write(ctx, releaseScript, s.key(id), strconv.FormatInt(token, 10)))
}

// fenced returns the answer of a write that replies 1 (done) or 0
// (fenced).
func (s *Store) fenced(op string, id store.ID, token int64) func(v any, err error) error {
	return func(v any, err error) error {
		if v == nil {
			return err
		}
		if n, _ := v.(int64); n != 1 {
			return fmt.Errorf("%w: redisstore: %s of %s with token %d", core.ErrFenced, op, id, token)
		}
		return err // a WAIT that fell short, or nil
	}
}

// Get implements store.Store with one HGETALL.
func (s *Store) Get(ctx context.Context, id store.ID, now time.Time) (store.Record, error) {
	m, err := s.c.HGetAll(ctx, s.key(id)).Result()
	if err != nil {
		return store.Record{}, unavailable("get", err)
	}
	if len(m) == 0 {
		return store.Record{}, fmt.Errorf("%w: redisstore: %s", core.ErrNotFound, id)
	}
	rec, err := decode(id, func(f string) (string, bool) { v, ok := m[f]; return v, ok })
	if err != nil {
		return store.Record{}, unavailable("get", err)
	}
	if !rec.ExpiresAt.After(now) {
		return store.Record{}, fmt.Errorf("%w: redisstore: %s expired", core.ErrNotFound, id)
	}
	return rec, nil
}

// Now reads the server's clock (TIME) for syncclock: pass the store to
// syncclock.New and the synced clock's Now to core.WithClock, so that
// every process decides leases and expiry by the Redis server's clock.
// On a cluster it reads the clock of the node that serves the empty
// key's slot.
func (s *Store) Now(ctx context.Context) (time.Time, error) {
	t, err := s.c.Time(ctx).Result()
	if err != nil {
		return time.Time{}, unavailable("now", err)
	}
	return t.UTC(), nil
}

// write runs a script that writes the record at key and, with
// WithReplicas, WAIT on the same connection. It returns the script's
// reply, and an error: with a nil reply, the script failed; with a reply,
// the write is done on the primary but fewer replicas than asked
// acknowledged it.
func (s *Store) write(ctx context.Context, sc *redis.Script, key string, args ...any) (any, error) {
	op := scriptName(sc)
	if s.replicas == 0 {
		v, err := sc.Run(ctx, s.c, []string{key}, args...).Result()
		if err != nil {
			return nil, unavailable(op, err)
		}
		return v, nil
	}
	node, ok := s.c.(*redis.Client)
	if cc, isCluster := s.c.(*redis.ClusterClient); isCluster {
		// WAIT counts the replicas of the node the connection is on: the
		// write and its WAIT go to the primary of the key.
		n, err := cc.MasterForKey(ctx, key)
		if err != nil {
			return nil, unavailable(op, err)
		}
		node, ok = n, true
	}
	if !ok {
		return nil, unavailable(op, fmt.Errorf("WithReplicas needs a *redis.Client or a *redis.ClusterClient, not %T", s.c))
	}
	// WAIT waits for the writes of its own connection: both go on one.
	cn := node.Conn()
	defer cn.Close()
	v, err := sc.Run(ctx, cn, []string{key}, args...).Result()
	if err != nil {
		return nil, unavailable(op, err)
	}
	n, err := cn.Wait(ctx, s.replicas, s.timeout).Result()
	switch {
	case err != nil:
		return v, unavailable(op, fmt.Errorf("%w: WAIT %d %d: %w (the write is on the primary; it may or may not survive a failover)",
			ErrNotReplicated, s.replicas, s.timeout.Milliseconds(), err))
	case n < int64(s.replicas):
		return v, unavailable(op, fmt.Errorf("%w: %d of %d replicas acknowledged the write within %v (it is on the primary; it may or may not survive a failover)",
			ErrNotReplicated, n, s.replicas, s.timeout))
	}
	return v, nil
}

// ErrNotReplicated is wrapped (beside core.ErrStoreUnavailable) by a
// write that fewer replicas acknowledged than WithReplicas asks.
var ErrNotReplicated = errors.New("redisstore: write not acknowledged by enough replicas")

func scriptName(sc *redis.Script) string {
	switch sc {
	case claimScript:
		return "claim"
	case extendScript:
		return "extend"
	case completeScript:
		return "complete"
	case releaseScript:
		return "release"
	}
	return "sweep"
}

// unavailable wraps a client or server error with core.ErrStoreUnavailable.
func unavailable(op string, err error) error {
	return fmt.Errorf("%w: redisstore: %s: %w", core.ErrStoreUnavailable, op, err)
}

// us formats t as Unix microseconds ("" for the zero time).
func us(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return strconv.FormatInt(t.UnixMicro(), 10)
}

// decodePairs decodes a record from HGETALL's reply inside a script: a
// flat list of field names and values.
func decodePairs(id store.ID, pairs []any) (store.Record, error) {
	m := make(map[string]string, len(pairs)/2)
	for i := 0; i+1 < len(pairs); i += 2 {
		k, _ := pairs[i].(string)
		v, _ := pairs[i+1].(string)
		m[k] = v
	}
	return decode(id, func(f string) (string, bool) { v, ok := m[f]; return v, ok })
}

// decode builds the record id from its hash fields (field returns a
// field's value and whether it is present). Byte slices are fresh copies.
func decode(id store.ID, field func(string) (string, bool)) (store.Record, error) {
	rec := store.Record{ID: id}
	var err error
	num := func(name string, dst *int64) {
		v, ok := field(name)
		if !ok || err != nil {
			return
		}
		n, perr := strconv.ParseInt(v, 10, 64)
		if perr != nil {
			err = fmt.Errorf("field %s of %s: %w", name, id, perr)
		}
		*dst = n
	}
	var state, token, attempt, lease, expires, created, status int64
	num("state", &state)
	num("token", &token)
	num("attempt", &attempt)
	num("lease", &lease)
	num("expires", &expires)
	num("created", &created)
	num("status", &status)
	if err != nil {
		return store.Record{}, err
	}
	if state < 1 || state > 3 {
		return store.Record{}, fmt.Errorf("record %s: state %d", id, state)
	}
	rec.State, rec.Token, rec.Attempt, rec.Status = store.State(state), token, int(attempt), int(status)
	if _, ok := field("lease"); ok {
		rec.LeaseUntil = time.UnixMicro(lease).UTC()
	}
	rec.ExpiresAt = time.UnixMicro(expires).UTC()
	rec.CreatedAt = time.UnixMicro(created).UTC()
	rec.Caller, _ = field("caller")
	rec.Scope, _ = field("scope")
	rec.Key, _ = field("key")
	if v, ok := field("fp"); ok && v != "" {
		rec.Fingerprint = []byte(v)
	}
	if v, ok := field("resp"); ok && v != "" {
		rec.Response = []byte(v)
	}
	return rec, nil
}

// idOf parses the ID from a record's key, or reports false for a key that
// is not one.
func (s *Store) idOf(key string) (store.ID, bool) {
	var id store.ID
	h, ok := strings.CutPrefix(key, s.prefix+"{")
	if !ok || len(h) != 2*len(id)+1 || h[len(h)-1] != '}' {
		return id, false
	}
	if _, err := hex.Decode(id[:], []byte(h[:len(h)-1])); err != nil {
		return id, false
	}
	return id, true
}
