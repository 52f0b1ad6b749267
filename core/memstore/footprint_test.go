package memstore_test

import (
	"net/http"
	"os"
	"runtime"
	"strconv"
	"testing"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/memstore"
	"github.com/idemkit/idem/internal/benchtest"
)

// TestMemoryFootprint logs the heap a stored record retains and the heap
// over a long run of replays. A measurement for BENCHMARKS.md, not a
// check: it runs when IDEM_FOOTPRINT is set (scripts/bench.sh sets it).
func TestMemoryFootprint(t *testing.T) {
	if os.Getenv("IDEM_FOOTPRINT") == "" {
		t.Skip("IDEM_FOOTPRINT not set (a measurement: see BENCHMARKS.md)")
	}
	heap := func() uint64 {
		runtime.GC()
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	// Records: the benchmark's requests (JSON body of 110 bytes, a 201
	// with a 46-byte body and Content-Type recorded), each with a new key.
	const records = 200_000
	st := memstore.New()
	e, err := core.New(st, core.WithSingleCaller())
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("POST /orders", e.Handler(http.HandlerFunc(benchtest.Handler)))
	before := heap()
	for i := range records {
		mux.ServeHTTP(benchtest.NewWriter(), benchtest.Request("footprint-key-"+strconv.Itoa(i)))
	}
	after := heap()
	if st.Len() != records {
		t.Fatalf("%d records, want %d", st.Len(), records)
	}
	t.Logf("footprint: %d records retain %d bytes: %.0f bytes per record (key of 20 bytes, scope %q, recorded response %d bytes of body)",
		records, after-before, float64(after-before)/records, "POST /orders", 46)

	// Replays of one key: the heap after each block of requests, GC'd.
	w := benchtest.NewWriter()
	mux.ServeHTTP(w, benchtest.Request("replayed"))
	const blocks, per = 10, 100_000
	var samples []uint64
	for range blocks {
		for range per {
			mux.ServeHTTP(benchtest.NewWriter(), benchtest.Request("replayed"))
		}
		samples = append(samples, heap())
	}
	growth := int64(samples[len(samples)-1]) - int64(samples[0])
	t.Logf("heap over %d replays, after each %d (GC'd): first %d, last %d bytes: growth %+d bytes after warm-up (%+.3f bytes per replay)",
		blocks*per, per, samples[0], samples[len(samples)-1], growth, float64(growth)/float64((blocks-1)*per))
	runtime.KeepAlive(st)
}
