package core_test

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/memstore"
)

const benchBody = `{"item":"coffee","quantity":2,"note":"oat milk, extra hot","address":{"street":"1 Main St","city":"Springfield"}}`

func benchHandler(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	w.Write([]byte(`{"id":"ord_123","item":"coffee","quantity":2}`))
}

func benchRequest(key string) *http.Request {
	r := httptest.NewRequest("POST", "/orders", strings.NewReader(benchBody))
	r.Header.Set("Content-Type", "application/json")
	r.Header.Set("Authorization", "Bearer acct_1")
	if key != "" {
		r.Header.Set(core.HeaderKey, key)
	}
	return r
}

type nopWriter struct{ h http.Header }

func (w *nopWriter) Header() http.Header         { return w.h }
func (w *nopWriter) WriteHeader(int)             {}
func (w *nopWriter) Write(b []byte) (int, error) { return len(b), nil }

func benchEngine(b *testing.B, opts ...core.RouteOption) http.Handler {
	e, err := core.New(memstore.New(), quiet, core.WithCaller(func(r *http.Request) (string, error) {
		return strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer "), nil
	}))
	if err != nil {
		b.Fatal(err)
	}
	return e.Handler(http.HandlerFunc(benchHandler), append([]core.RouteOption{core.Scope("POST /orders")}, opts...)...)
}

func BenchmarkMiddleware(b *testing.B) {
	keys := make([]string, 1<<16)
	for i := range keys {
		keys[i] = "key-" + strconv.Itoa(i)
	}
	b.Run("bare", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			benchHandler(&nopWriter{h: http.Header{}}, benchRequest(keys[i%len(keys)]))
		}
	})
	b.Run("first", func(b *testing.B) {
		h := benchEngine(b)
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			if i%len(keys) == 0 && i > 0 {
				h = benchEngine(b) // fresh store: every request is a first execution
			}
			h.ServeHTTP(&nopWriter{h: http.Header{}}, benchRequest(keys[i%len(keys)]))
		}
	})
	b.Run("replay", func(b *testing.B) {
		h := benchEngine(b)
		h.ServeHTTP(&nopWriter{h: http.Header{}}, benchRequest("k"))
		b.ReportAllocs()
		for b.Loop() {
			h.ServeHTTP(&nopWriter{h: http.Header{}}, benchRequest("k"))
		}
	})
	b.Run("passthrough", func(b *testing.B) {
		h := benchEngine(b, core.KeyOptional())
		b.ReportAllocs()
		for b.Loop() {
			h.ServeHTTP(&nopWriter{h: http.Header{}}, benchRequest(""))
		}
	})
}
