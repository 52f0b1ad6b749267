package ginbench_test

import (
	"net/http"
	"strconv"
	"testing"

	"github.com/gin-gonic/gin"
	"github.com/gofiber/fiber/v3"
	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/fiberidem"
	"github.com/idemkit/idem/ginidem"
	"github.com/idemkit/idem/internal/benchtest"
	"github.com/valyala/fasthttp"
)

// BenchmarkFiberVsGin serves POST /orders (benchtest.Handler's answer,
// benchtest.Body, a caller in Authorization) on Gin and on Fiber, bare and
// protected by idem, for a first execution (a new key each time), a
// replay and a pass-through (no key, KeyOptional), side by side in one
// run:
//
//	go test -run '^$' -bench FiberVsGin -benchmem -count 6 | benchstat -col /fw,/mw -
//
// Gin gets a request built by httptest.NewRequest each time, as net/http's
// server builds one (its header map and strings included); Fiber gets a
// fasthttp request refilled in place, as fasthttp's server refills it
// (nothing allocated). So compare idem's cost on each (idem minus bare),
// not the two bare figures: on Fiber that cost includes the net/http view
// of the request the engine reads (the header map and one copy of the
// header bytes), which on Gin net/http has already made.
func BenchmarkFiberVsGin(b *testing.B) {
	gin.SetMode(gin.ReleaseMode)
	keys := make([]string, 1<<16)
	for i := range keys {
		keys[i] = "key-" + strconv.Itoa(i)
	}
	paths := []struct {
		name string
		key  func(i int) string
		opts []core.RouteOption
		warm []string // keys completed before the timer starts
	}{
		{"first", func(i int) string { return keys[i%len(keys)] }, nil, nil},
		{"replay", func(int) string { return "replayed-key" }, nil, []string{"replayed-key"}},
		{"passthrough", func(int) string { return "" }, []core.RouteOption{core.KeyOptional()}, nil},
	}
	for _, p := range paths {
		b.Run("path="+p.name, func(b *testing.B) {
			for _, mw := range []string{"bare", "idem"} {
				b.Run("fw=gin/mw="+mw, func(b *testing.B) {
					build := func() http.Handler {
						r := gin.New()
						if mw == "bare" {
							r.POST("/orders", gin.WrapF(benchtest.Handler))
						} else {
							r.POST("/orders", ginidem.New(benchtest.Engine(b), p.opts...), gin.WrapF(benchtest.Handler))
						}
						return r
					}
					h := build()
					for _, k := range p.warm {
						h.ServeHTTP(benchtest.NewWriter(), benchtest.Request(k))
					}
					b.ReportAllocs()
					for i := 0; b.Loop(); i++ {
						if i%len(keys) == 0 && i > 0 && p.warm == nil {
							b.StopTimer()
							h = build() // a fresh store: every request stays a first execution
							b.StartTimer()
						}
						h.ServeHTTP(benchtest.NewWriter(), benchtest.Request(p.key(i)))
					}
				})
				b.Run("fw=fiber/mw="+mw, func(b *testing.B) {
					build := func() fasthttp.RequestHandler {
						app := fiber.New()
						h := func(c fiber.Ctx) error {
							c.Set("Content-Type", "application/json")
							return c.Status(http.StatusCreated).Send(answer)
						}
						if mw == "bare" {
							app.Post("/orders", h)
						} else {
							app.Post("/orders", fiberidem.New(benchtest.Engine(b), p.opts...), h)
						}
						return app.Handler()
					}
					h := build()
					var ctx fasthttp.RequestCtx
					serve := func(key string) {
						fill(&ctx, key)
						h(&ctx)
						if s := ctx.Response.StatusCode(); s != http.StatusCreated {
							b.Fatalf("status %d: %s", s, ctx.Response.Body())
						}
					}
					for _, k := range p.warm {
						serve(k)
					}
					b.ReportAllocs()
					for i := 0; b.Loop(); i++ {
						if i%len(keys) == 0 && i > 0 && p.warm == nil {
							b.StopTimer()
							h = build()
							b.StartTimer()
						}
						serve(p.key(i))
					}
				})
			}
		})
	}
}

// answer is benchtest.Handler's body.
var answer = []byte(`{"id":"ord_123","item":"coffee","quantity":2}`)

// fill makes ctx's request benchtest.Request(key), in place, and resets its
// response, as fasthttp's server does between two requests of a
// connection.
func fill(ctx *fasthttp.RequestCtx, key string) {
	ctx.Request.Reset()
	ctx.Response.Reset()
	ctx.Request.Header.SetMethod(http.MethodPost)
	ctx.Request.SetRequestURI("/orders")
	ctx.Request.Header.SetHost("example.com")
	ctx.Request.Header.SetContentType("application/json")
	ctx.Request.Header.Set("Authorization", "Bearer acct_1")
	if key != "" {
		ctx.Request.Header.Set(core.HeaderKey, key)
	}
	ctx.Request.SetBodyString(benchtest.Body)
}
