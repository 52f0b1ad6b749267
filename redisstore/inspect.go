package redisstore

import (
	"bytes"
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem/core/store"
)

// scanCount is the COUNT hint of the SCANs of List and DeleteExpired: how
// many keys one SCAN call looks at, and so how many records one pipelined
// read asks for.
const scanCount = 1000

// listFields are the hash fields List reads: all but the response.
var listFields = []string{"state", "token", "attempt", "lease", "expires", "created", "status", "fp", "caller", "scope", "key"}

// List implements store.Inspector. Redis has no index on a hash's fields,
// and one that the store kept (a sorted set per state) would be a second
// key in another hash slot, written by every claim and completion: so
// List SCANs the store's keys (every primary of a cluster) and reads
// each record's fields but the response, keeping the page's oldest
// q.Limit. One call costs a pass over every record the prefix holds
// (about one round trip per thousand records, and the fields of each):
// an operator's query, not one for the request path. It takes no lock;
// a record written during the pass may or may not be listed.
func (s *Store) List(ctx context.Context, q store.ListQuery) ([]store.Record, error) {
	if err := q.Check(); err != nil {
		return nil, err
	}
	var page []store.Record
	cut := func() {
		slices.SortFunc(page, func(a, b store.Record) int { return compareCursor(store.CursorOf(a), store.CursorOf(b)) })
		if len(page) > q.Limit {
			page = page[:q.Limit]
		}
	}
	err := s.scan(ctx, func(ctx context.Context, c redis.Cmdable, keys []string) error {
		cmds := make([]*redis.SliceCmd, len(keys))
		if _, err := c.Pipelined(ctx, func(p redis.Pipeliner) error {
			for i, k := range keys {
				cmds[i] = p.HMGet(ctx, k, listFields...)
			}
			return nil
		}); err != nil {
			return err
		}
		for i, cmd := range cmds {
			id, _ := s.idOf(keys[i])
			vals := cmd.Val()
			if len(vals) != len(listFields) || vals[0] == nil {
				continue // deleted since the SCAN saw it
			}
			rec, err := decode(id, func(f string) (string, bool) {
				i := slices.Index(listFields, f)
				if i < 0 {
					return "", false // the response, not read
				}
				v, ok := vals[i].(string)
				return v, ok
			})
			if err != nil {
				return err
			}
			if rec.State != q.State || !rec.ExpiresAt.After(q.Now) ||
				(!q.CreatedBefore.IsZero() && !rec.CreatedAt.Before(q.CreatedBefore)) ||
				(!q.After.IsZero() && compareCursor(store.CursorOf(rec), q.After) <= 0) {
				continue
			}
			page = append(page, rec)
		}
		if len(page) > 2*q.Limit {
			cut()
		}
		return nil
	})
	if err != nil {
		return nil, unavailable("list", err)
	}
	cut()
	return page, nil
}

// compareCursor orders positions as List does: by CreatedAt, then ID.
func compareCursor(a, b store.Cursor) int {
	if c := a.CreatedAt.Compare(b.CreatedAt); c != 0 {
		return c
	}
	return bytes.Compare(a.ID[:], b.ID[:])
}

// DeleteExpired implements store.Store, though nothing needs to call it:
// Redis deletes every record's key by itself, keyGrace (a minute) after
// its ExpiresAt, so no Sweeper is needed (run none). It deletes records
// whose ExpiresAt <= now that Redis has not yet deleted (within that
// minute), each with a script that checks ExpiresAt again, so concurrent
// calls delete each record once; but it SCANs every key of the prefix to
// find them, as List does.
func (s *Store) DeleteExpired(ctx context.Context, now time.Time, limit int) (int, error) {
	deleted := 0
	if limit <= 0 {
		return 0, nil
	}
	nowArg := us(now)
	stop := func() bool { return deleted >= limit }
	err := s.scan(ctx, func(ctx context.Context, c redis.Cmdable, keys []string) error {
		cmds := make([]*redis.StringCmd, len(keys))
		if _, err := c.Pipelined(ctx, func(p redis.Pipeliner) error {
			for i, k := range keys {
				cmds[i] = p.HGet(ctx, k, "expires")
			}
			return nil
		}); err != nil && !errors.Is(err, redis.Nil) {
			return err
		}
		for i, cmd := range cmds {
			if stop() {
				return errStop
			}
			e, err := strconv.ParseInt(cmd.Val(), 10, 64)
			if err != nil || time.UnixMicro(e).After(now) {
				continue // gone, or live
			}
			n, err := sweepScript.Run(ctx, c, []string{keys[i]}, nowArg).Int()
			if err != nil {
				return err
			}
			deleted += n
		}
		if stop() {
			return errStop
		}
		return nil
	})
	if err != nil && !errors.Is(err, errStop) {
		return deleted, unavailable("delete expired", err)
	}
	return deleted, nil
}

// errStop ends a scan early.
var errStop = &stopError{}

type stopError struct{}

func (*stopError) Error() string { return "stop" }

// scan calls fn with the store's keys, a SCAN page at a time, and the
// client of the server that holds them (each primary of a cluster in
// turn). It stops at fn's first error, which it returns.
func (s *Store) scan(ctx context.Context, fn func(ctx context.Context, c redis.Cmdable, keys []string) error) error {
	match := globEscape(s.prefix) + "{*}"
	return s.eachPrimary(ctx, func(ctx context.Context, c redis.Cmdable) error {
		var cursor uint64
		for {
			keys, next, err := c.Scan(ctx, cursor, match, scanCount).Result()
			if err != nil {
				return err
			}
			if len(keys) > 0 {
				if err := fn(ctx, c, keys); err != nil {
					return err
				}
			}
			if next == 0 {
				return nil
			}
			cursor = next
		}
	})
}

// eachPrimary calls fn for each server that holds records: every primary
// of a cluster (or shard of a ring), one after the other, or the one
// server.
func (s *Store) eachPrimary(ctx context.Context, fn func(ctx context.Context, c redis.Cmdable) error) error {
	var (
		mu    sync.Mutex
		nodes []*redis.Client
	)
	collect := func(_ context.Context, c *redis.Client) error {
		mu.Lock()
		nodes = append(nodes, c)
		mu.Unlock()
		return nil
	}
	switch c := s.c.(type) {
	case *redis.ClusterClient:
		if err := c.ForEachMaster(ctx, collect); err != nil {
			return err
		}
	case *redis.Ring:
		if err := c.ForEachShard(ctx, collect); err != nil {
			return err
		}
	default:
		return fn(ctx, s.c)
	}
	slices.SortFunc(nodes, func(a, b *redis.Client) int { return strings.Compare(a.Options().Addr, b.Options().Addr) })
	for _, n := range nodes {
		if err := fn(ctx, n); err != nil {
			return err
		}
	}
	return nil
}

// globEscape escapes the characters that SCAN's MATCH reads as a pattern.
func globEscape(s string) string {
	var b strings.Builder
	for _, r := range s {
		if strings.ContainsRune(`*?[]\`, r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}
