// Package benchtest is the in-process overhead benchmark that net/http and
// every adapter (ginidem, echoidem, echo5idem, chiidem, Gin through
// fiberidem's ginbench) run: the same handler with and without the
// middleware, on a memory store, for the three paths a protected route
// sees. It is internal: a harness of idem's own tests, not part of its API.
//
// An adapter's tests call [Run] with a function that builds its router:
//
//	func BenchmarkOverhead(b *testing.B) {
//		benchtest.Run(b, func(e *core.Engine, opts ...core.RouteOption) http.Handler {
//			r := gin.New()
//			if e == nil {
//				r.POST("/orders", gin.WrapF(benchtest.Handler)) // bare
//			} else {
//				r.POST("/orders", ginidem.New(e, opts...), gin.WrapF(benchtest.Handler))
//			}
//			return r
//		})
//	}
//
// Sub-benchmarks are named path=first|replay|passthrough/mw=bare|idem, so
// benchstat can put the two sides next to each other:
//
//	go test -run '^$' -bench Overhead -benchmem -count 10 > out.txt
//	benchstat -col /mw out.txt
//
// Both sides build their request with httptest.NewRequest and write to a
// fresh writer, so the ratio idem/bare is the cost of the middleware plus
// the same request construction. Besides ns/op (wall time) each benchmark
// reports cpu-ns/op: the CPU time of the whole process (GC workers
// included) per request, which a machine shared with other work disturbs
// much less than wall time. Compare ratios from one run; never assert
// times, these machines are shared.
package benchtest

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/memstore"
)

// Body is the request body of every benchmarked request.
const Body = `{"item":"coffee","quantity":2,"note":"oat milk, extra hot","address":{"street":"1 Main St","city":"Springfield"}}`

// Handler is the benchmarked handler: a small JSON 201.
func Handler(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	_, _ = w.Write([]byte(`{"id":"ord_123","item":"coffee","quantity":2}`))
}

// Request returns POST /orders with Body, a caller (Authorization) and,
// unless key is "", an Idempotency-Key.
func Request(key string) *http.Request {
	r := httptest.NewRequest("POST", "/orders", strings.NewReader(Body))
	r.Header.Set("Content-Type", "application/json")
	r.Header.Set("Authorization", "Bearer acct_1")
	if key != "" {
		r.Header.Set(core.HeaderKey, key)
	}
	return r
}

// Writer is a ResponseWriter that discards what it is given.
type Writer struct{ H http.Header }

// NewWriter returns a Writer with an empty header map.
func NewWriter() *Writer { return &Writer{H: http.Header{}} }

func (w *Writer) Header() http.Header         { return w.H }
func (w *Writer) WriteHeader(int)             {}
func (w *Writer) Write(b []byte) (int, error) { return len(b), nil }

// Engine returns an engine over a fresh memory store whose caller is the
// bearer token, logging nothing.
func Engine(tb testing.TB) *core.Engine {
	e, err := core.New(memstore.New(),
		core.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))),
		core.WithCaller(func(r *http.Request) (string, error) {
			return strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer "), nil
		}))
	if err != nil {
		tb.Fatal(err)
	}
	return e
}

// Build returns the router under test serving POST /orders with Handler:
// bare when e is nil, else protected by e with the route options opts.
type Build func(e *core.Engine, opts ...core.RouteOption) http.Handler

// keys is the number of distinct keys of the first-execution path; the
// store is replaced (timer stopped) each time they are used up.
const keys = 1 << 16

// Run runs the overhead benchmarks over the router that build returns:
// path=first (a new key per request), path=replay (one key, completed
// before the timer starts) and path=passthrough (no key, route with
// core.KeyOptional), each with mw=bare and mw=idem.
func Run(b *testing.B, build Build) {
	ks := make([]string, keys)
	for i := range ks {
		ks[i] = "key-" + strconv.Itoa(i)
	}
	serve := func(b *testing.B, h http.Handler, key func(i int) string, rebuild func() http.Handler) {
		b.ReportAllocs()
		cpu0, cpuOK := cpuTime()
		for i := 0; b.Loop(); i++ {
			if i%keys == 0 && i > 0 && rebuild != nil {
				b.StopTimer()
				h = rebuild() // a fresh store: every request stays a first execution
				b.StartTimer()
			}
			w := NewWriter()
			h.ServeHTTP(w, Request(key(i)))
		}
		if cpu1, ok := cpuTime(); ok && cpuOK {
			b.ReportMetric(float64(cpu1-cpu0)/float64(b.N), "cpu-ns/op")
		}
	}
	check := func(b *testing.B, h http.Handler, key string, want string) {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, Request(key))
		if w.Code != http.StatusCreated || w.Header().Get(core.HeaderReplayed) != want {
			b.Fatalf("warm-up: status %d, %s %q (want 201, %q): %s", w.Code, core.HeaderReplayed, w.Header().Get(core.HeaderReplayed), want, w.Body)
		}
	}
	fresh := func(i int) string { return ks[i%keys] }
	fixed := func(int) string { return "replayed-key" }
	none := func(int) string { return "" }

	b.Run("path=first", func(b *testing.B) {
		b.Run("mw=bare", func(b *testing.B) { serve(b, build(nil), fresh, nil) })
		b.Run("mw=idem", func(b *testing.B) {
			rebuild := func() http.Handler { return build(Engine(b)) }
			h := rebuild()
			check(b, h, "warm-up", "")
			serve(b, h, fresh, rebuild)
		})
	})
	b.Run("path=replay", func(b *testing.B) {
		b.Run("mw=bare", func(b *testing.B) { serve(b, build(nil), fixed, nil) })
		b.Run("mw=idem", func(b *testing.B) {
			h := build(Engine(b))
			check(b, h, fixed(0), "")
			check(b, h, fixed(0), "true")
			serve(b, h, fixed, nil)
		})
	})
	b.Run("path=passthrough", func(b *testing.B) {
		b.Run("mw=bare", func(b *testing.B) { serve(b, build(nil), none, nil) })
		b.Run("mw=idem", func(b *testing.B) {
			h := build(Engine(b), core.KeyOptional())
			check(b, h, "", "")
			serve(b, h, none, nil)
		})
	})
}
