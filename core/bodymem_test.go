package core_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/memstore"
)

// stalled is a request body that delivers a few bytes, then blocks (a slow
// or hostile client) until released, then ends short.
type stalled struct {
	head    io.Reader
	waiting chan<- struct{}
	release <-chan struct{}
	once    sync.Once
}

func (s *stalled) Read(p []byte) (int, error) {
	if n, _ := s.head.Read(p); n > 0 {
		return n, nil
	}
	s.once.Do(func() { s.waiting <- struct{}{} })
	<-s.release
	return 0, io.ErrUnexpectedEOF
}

func (s *stalled) Close() error { return nil }

// TestSlowBodiesHoldWhatTheySent: 100 requests that each declare a 1 MiB
// body and send 5 bytes hold memory for what they sent, not for what they
// declared (docs/contract.md, section 2 "Fingerprint"): the heap grows by
// a few KiB per request while they wait, where sizing the buffer from
// Content-Length held 100 MiB.
func TestSlowBodiesHoldWhatTheySent(t *testing.T) {
	const (
		requests = 100
		declared = 1 << 20
		perReq   = 32 << 10 // the bound: far below the 1 MiB declared
	)
	e, err := core.New(memstore.New(), core.WithSingleCaller(), quiet)
	if err != nil {
		t.Fatal(err)
	}
	h := e.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t.Error("the handler ran on a body that never arrived")
	}))
	waiting := make(chan struct{}, requests)
	release := make(chan struct{})
	var wg sync.WaitGroup
	statuses := make([]int, requests)

	var before, during runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for i := range requests {
		r := httptest.NewRequest(http.MethodPost, "/orders", nil)
		r.Body = &stalled{head: strings.NewReader(`{"a":`), waiting: waiting, release: release}
		r.ContentLength = declared
		r.Header.Set("Content-Type", "application/json")
		r.Header.Set(core.HeaderKey, "k"+string(rune('a'+i%26))+string(rune('a'+i/26)))
		wg.Go(func() {
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			statuses[i] = w.Code
		})
	}
	for range requests {
		<-waiting // every request has read its 5 bytes and waits for more
	}
	runtime.GC()
	runtime.ReadMemStats(&during)
	close(release)
	wg.Wait()

	grown := int64(during.HeapAlloc) - int64(before.HeapAlloc)
	t.Logf("%d requests waiting on 1 MiB bodies after 5 bytes: heap grew by %d bytes (%d per request)", requests, grown, grown/requests)
	if grown > requests*perReq {
		t.Errorf("heap grew by %d bytes (%d per request) for %d requests that sent 5 bytes each, want at most %d per request", grown, grown/requests, requests, perReq)
	}
	for i, s := range statuses {
		if s != http.StatusBadRequest {
			t.Fatalf("request %d: status %d, want 400 (the body ended short)", i, s)
		}
	}
}
