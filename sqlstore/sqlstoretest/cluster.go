package sqlstoretest

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/sqlstore"
)

// ClusterConfig describes stores on the nodes of a multi-primary cluster
// (MariaDB Galera): New returns one fixture per node, every one on the same
// table, each through a pool of its own on its node's DSN.
type ClusterConfig struct {
	Dialect sqlstore.Dialect
	New     func(t *testing.T) []Fixture
}

// RunExactlyOnceAcross is RunExactlyOnce with one key's concurrent
// requests spread over the cluster's nodes (request i goes to a service
// on node i mod n), in atomic mode (the handler inserts a business row in
// the shared transaction) and in leased mode (the handler's effect is
// outside the database, like a payment provider's charge), under the
// reject and the wait policy. A node's claim cannot see another node's
// uncommitted claim; the loser learns at its commit (certification) or at
// its write (a brute-force abort). Whatever the node, exactly one handler
// runs, and every answer is that execution's 201, its replay, or (reject
// policy) 409 with Retry-After: never 503, never a second effect.
func RunExactlyOnceAcross(t *testing.T, cfg ClusterConfig) {
	for _, m := range []struct {
		name   string
		leased bool
	}{{"atomic", false}, {"leased", true}} {
		for _, p := range []struct {
			name string
			opts []core.RouteOption
		}{
			{"reject", nil},
			{"wait", []core.RouteOption{core.WaitInFlight(failsafe)}},
		} {
			t.Run(m.name+"/"+p.name, func(t *testing.T) {
				opts := p.opts
				if m.leased {
					opts = append(opts[:len(opts):len(opts)], core.Leased())
				}
				exactlyOnceAcross(t, cfg, m.leased, len(p.opts) > 0, opts)
			})
		}
	}
}

func exactlyOnceAcross(t *testing.T, cfg ClusterConfig, leased, waits bool, opts []core.RouteOption) {
	const (
		rounds     = 4
		concurrent = 24
		sequential = 12
		holdMS     = 50
	)
	fs := cfg.New(t)
	if len(fs) < 2 {
		t.Fatalf("the cluster has %d nodes, want at least 2", len(fs))
	}
	var runs atomic.Int64 // handler executions over every node
	srvs := make([]*orderServer, len(fs))
	for i, f := range fs {
		srvs[i] = newOrderServerRunning(t, f, leased, &runs, opts...)
		warm(t, f.DB, concurrent/len(fs)+2)
	}
	lost := int64(0)
	defer func() { t.Logf("%d rounds: %d first executions lost certification", rounds, lost) }()
	for round := range rounds {
		ctx := ctxT(t) // each round its own failsafe: one for all of them runs out on a loaded machine
		runs.Store(0)
		key := fmt.Sprintf("across-%d-%s", round, Table())
		item := key
		body := orderBody(item, holdMS)
		answers := make([]answer, concurrent)
		var wg sync.WaitGroup
		gate := make(chan struct{})
		for i := range answers {
			wg.Go(func() {
				<-gate
				s := srvs[i%len(srvs)]
				answers[i] = post(ctx, s.client, s.URL+"/orders", key, body)
			})
		}
		close(gate)
		wg.Wait()
		var first *answer
		executed, replayed, conflict := 0, 0, 0
		check := func(what string, a answer) {
			switch {
			case a.err != nil:
				t.Errorf("round %d, %s: %v", round, what, a.err)
			case a.status == http.StatusCreated:
				if !a.replayed {
					executed++
				} else {
					replayed++
				}
				if first == nil {
					first = &a
				} else if string(a.body) != string(first.body) {
					t.Errorf("round %d, %s: 201 %q, but another 201 was %q: two executions", round, what, a.body, first.body)
				}
			case a.status == http.StatusConflict && !waits && a.retryAfter != "" && strings.HasPrefix(a.contentType, "application/problem+json"):
				conflict++
			default:
				t.Errorf("round %d, %s: %v, want the 201%s", round, what, a, map[bool]string{false: ", its replay, or 409 with Retry-After", true: " or its replay"}[waits])
			}
		}
		for i, a := range answers {
			check(fmt.Sprintf("concurrent request %d (node %d)", i, i%len(srvs)), a)
		}

		// Afterwards every node replays the one execution (each node reads
		// what the others committed).
		for i := range sequential {
			s := srvs[i%len(srvs)]
			a := post(ctx, s.client, s.URL+"/orders", key, body)
			if a.err != nil || a.status != http.StatusCreated || !a.replayed {
				t.Errorf("round %d, sequential request %d (node %d): %v, want the 201 replay", round, i, i%len(srvs), a)
				continue
			}
			check(fmt.Sprintf("sequential request %d", i), a)
		}
		if executed != 1 {
			t.Errorf("round %d: %d answers were a first execution (201 without %s), want 1", round, executed, core.HeaderReplayed)
		}
		runs := runs.Load()
		if leased {
			// The effect is outside the database: only the node whose
			// claim the cluster certified may run the handler.
			if runs != 1 {
				t.Errorf("round %d: the handler ran %d times over %d nodes, want 1", round, runs, len(srvs))
			}
		} else {
			// Each node's claim sees only its own uncommitted claims, so
			// the handler may run on several nodes; every run but the
			// certified one is rolled back with its business row.
			if n := fs[0].Count(t, item); n != 1 {
				t.Errorf("round %d: %d business rows, want exactly 1", round, n)
			}
		}
		lost += runs - 1
		t.Logf("round %d: %d concurrent over %d nodes: %d handler runs (%d lost certification, rolled back), %d executed, %d replayed, %d in progress (409)",
			round, concurrent, len(srvs), runs, runs-1, executed, replayed, conflict)
	}
}

// newOrderServerRunning is newOrderServer counting executions in runs; in
// leased mode the handler's effect is the count alone (nothing written in
// the database: the effect of a payment provider).
func newOrderServerRunning(t *testing.T, f Fixture, leased bool, runs *atomic.Int64, opts ...core.RouteOption) *orderServer {
	t.Helper()
	if leased {
		f.Insert = func(ctx context.Context, _ string) error {
			core.MarkEffect(ctx)
			return nil
		}
	}
	return newOrderServerWith(t, f, false, func() { runs.Add(1) }, opts...)
}
