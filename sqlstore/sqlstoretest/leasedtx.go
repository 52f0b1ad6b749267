package sqlstoretest

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/store"
)

// partitioned is a TxStore behind which the attempts claimed while cut is
// set are cut off from the store for good, as a process across a network
// partition: the attempt lives on, its lease extensions fail, its lease
// lapses, and a retry from elsewhere takes it over. Claims made after cut
// is cleared are not partitioned, so the takeover's own lease holds and
// the old attempt's heartbeat cannot renew its lease before the takeover
// claims (a partition healed at that moment would race the two).
type partitioned struct {
	store.TxStore
	cut  atomic.Bool
	mu   sync.Mutex
	lost map[int64]bool // tokens of the attempts cut off
}

func (p *partitioned) Claim(ctx context.Context, req store.ClaimRequest) (store.ClaimResult, error) {
	if p.cut.Load() {
		p.mu.Lock()
		p.lost[req.Token] = true
		p.mu.Unlock()
	}
	return p.TxStore.Claim(ctx, req)
}

func (p *partitioned) Extend(ctx context.Context, id store.ID, token int64, until time.Time) error {
	p.mu.Lock()
	lost := p.lost[token]
	p.mu.Unlock()
	if lost {
		return fmt.Errorf("%w: sqlstoretest: partitioned", core.ErrStoreUnavailable)
	}
	return p.TxStore.Extend(ctx, id, token, until)
}

// leasedLocalWrites: a Leased route on a SQL store, the documented shape
// for "external call + local writes" (docs/contract.md, section 5 "The
// result commits with the completion"): the handler charges a provider
// with its downstream key, then writes its business row through the
// store's accessor, which gives it the attempt's own transaction; the row
// and the completion commit together. An attempt that lost its lease to a
// takeover while it waited on the provider never commits its row (its
// completion is fenced in the same transaction), so the business row is
// written once and the provider, deduplicating by downstream key, charged
// once. (Issue 21, item 5: a takeover ran the local writes twice.)
func leasedLocalWrites(t *testing.T, cfg Config) {
	f := cfg.New(t)
	st := &partitioned{TxStore: f.Store, lost: map[int64]bool{}}
	f.Store = st
	e, err := core.New(st, core.WithSingleCaller(), core.WithLease(200*time.Millisecond), core.WithLogger(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError + 4}))))
	if err != nil {
		t.Fatal(err)
	}
	var (
		runs     atomic.Int64
		mu       sync.Mutex
		provider = map[string]int{} // charges by downstream key
		entered  = make(chan struct{}, 1)
		release  = make(chan struct{})
	)
	mux := http.NewServeMux()
	mux.Handle("POST /transfers", e.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := runs.Add(1)
		ctx := r.Context()
		if err := core.MarkEffect(ctx); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		dk, err := core.DownstreamKey(ctx, "payout")
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		mu.Lock()
		provider[dk]++
		mu.Unlock()
		if r.URL.Query().Get("hold") != "" && n == 1 {
			entered <- struct{}{}
			<-release // waiting on the provider, partitioned from the store
		}
		if err := f.Insert(ctx, r.URL.Query().Get("item")); err != nil {
			http.Error(w, "the leased attempt's local write: "+err.Error(), http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"run":%d}`, n)
	}), core.Leased()))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	unblock := sync.OnceFunc(func() { close(release) })
	t.Cleanup(unblock) // before srv.Close, which waits for the held handler
	ctx := ctxT(t)

	// A plain run: the row commits with the record, the retry replays.
	item := "leased-local-" + Table()[len("idem_t_"):]
	first := post(ctx, srv.Client(), srv.URL+"/transfers?item="+item, item, `{}`)
	if first.err != nil || first.status != http.StatusCreated {
		t.Fatalf("first request: %v, want 201", first)
	}
	again := post(ctx, srv.Client(), srv.URL+"/transfers?item="+item, item, `{}`)
	if again.err != nil || again.status != http.StatusCreated || !again.replayed || string(again.body) != string(first.body) {
		t.Fatalf("retry: %v, want the 201 replayed", again)
	}
	if n := f.Count(t, item); n != 1 {
		t.Fatalf("%d business rows, want 1", n)
	}

	// A takeover while the first attempt waits on the provider.
	runs.Store(0)
	item = "leased-takeover-" + Table()[len("idem_t_"):]
	url := srv.URL + "/transfers?hold=1&item=" + item
	st.cut.Store(true)
	old := make(chan answer, 1)
	go func() { old <- post(ctx, srv.Client(), url, item, `{}`) }()
	select {
	case <-entered:
	case a := <-old:
		t.Fatalf("the first attempt answered before it waited on the provider: %v", a)
	}
	st.cut.Store(false)
	time.Sleep(500 * time.Millisecond) // the lease (200 ms) lapses: nothing extends it
	takeover := post(ctx, srv.Client(), url, item, `{}`)
	if takeover.err != nil || takeover.status != http.StatusCreated || takeover.replayed {
		t.Fatalf("the takeover: %v, want its own 201", takeover)
	}
	unblock()
	a := <-old
	if a.err != nil || a.status == http.StatusCreated {
		t.Fatalf("the attempt that lost its lease: %v, want no 201 of its own (its completion is fenced)", a)
	}
	if n := f.Count(t, item); n != 1 {
		t.Fatalf("%d business rows, want 1: the fenced attempt's local write must not commit", n)
	}
	final := post(ctx, srv.Client(), url, item, `{}`)
	if final.err != nil || final.status != http.StatusCreated || !final.replayed || string(final.body) != string(takeover.body) {
		t.Fatalf("a later retry: %v, want the takeover's 201 replayed", final)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(provider) != 2 {
		t.Fatalf("%d downstream keys for two requests, want 2", len(provider))
	}
}
