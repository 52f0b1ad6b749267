package fiberidem_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/gofiber/fiber/v3"
	"github.com/gofiber/fiber/v3/middleware/rewrite"
	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/memstore"
	"github.com/idemkit/idem/fiberidem"
)

// rawDo sends req, raw bytes, to the server at base (listen's URL) on a
// connection of its own, so that the path reaches the server exactly as
// written, and returns the status, the Idempotent-Replayed field and the
// body.
func rawDo(t *testing.T, base, req string) (status int, replayed, body string) {
	t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := io.WriteString(conn, req); err != nil {
		t.Fatal(err)
	}
	res, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, res.Header.Get(core.HeaderReplayed), string(b)
}

// rawPost is a POST of a JSON body to path (as written) with key in the
// field named keyField ("" for none).
func rawPost(path, keyField, key, body string) string {
	field := ""
	if keyField != "" {
		field = keyField + ": " + key + "\r\n"
	}
	return "POST " + path + " HTTP/1.1\r\nHost: x\r\n" + field + "Content-Type: application/json\r\nContent-Length: " +
		fmt.Sprint(len(body)) + "\r\nConnection: close\r\n\r\n" + body
}

func singleCaller(t *testing.T) *core.Engine {
	t.Helper()
	e, err := core.New(memstore.New(), core.WithSingleCaller())
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// TestUseTrailingSlashes: installed with app.Use, a request whose path
// ends in several slashes reaches its route (Fiber, StrictRouting off,
// trims them all), so it is protected like the path without them: a
// retry is replayed, and a request without a key is a 400.
func TestUseTrailingSlashes(t *testing.T) {
	for _, path := range []string{"/payments/", "/payments//", "/payments///", "/orders/7//"} {
		t.Run(path, func(t *testing.T) {
			var n atomic.Int32
			app := fiber.New()
			app.Use(fiberidem.New(singleCaller(t)))
			h := func(c fiber.Ctx) error { return c.Status(201).SendString(fmt.Sprintf("charge %d", n.Add(1))) }
			app.Post("/payments", h)
			app.Post("/orders/:id", h)
			url, _ := listen(t, app, 0)
			req := rawPost(path, core.HeaderKey, "pay-1", `{"amount":100}`)
			s1, _, b1 := rawDo(t, url, req)
			s2, rep, b2 := rawDo(t, url, req)
			if s1 != 201 || s2 != 201 || rep != "true" || b1 != b2 || n.Load() != 1 {
				t.Errorf("first %d %q; retry %d replayed=%q %q; the handler ran %d times, want once and a replay", s1, b1, s2, rep, b2, n.Load())
			}
			if s, _, b := rawDo(t, url, rawPost(path, "", "", `{"amount":100}`)); s != 400 || !strings.Contains(b, "missing-key") {
				t.Errorf("no key: %d %q, want 400 missing-key", s, b)
			}
		})
	}
}

// TestUseRouteLookup: under app.Use, no POST that Fiber routes to a
// handler runs without a key, whatever the routing configuration and
// the spelling of the path (trailing slashes, case, escapes, optional
// parameters, constraints, wildcards).
func TestUseRouteLookup(t *testing.T) {
	for _, cfg := range []fiber.Config{{}, {StrictRouting: true}, {CaseSensitive: true}, {UnescapePath: true}} {
		name := fmt.Sprintf("strict=%v,case=%v,unescape=%v", cfg.StrictRouting, cfg.CaseSensitive, cfg.UnescapePath)
		t.Run(name, func(t *testing.T) {
			app := fiber.New(cfg)
			app.Use(fiberidem.New(singleCaller(t)))
			h := func(c fiber.Ctx) error { return c.Status(201).SendString("ran " + c.Route().Path) }
			for _, p := range []string{"/payments", "/orders/:id", "/files/*", "/opt/:n?", "/c/:id<int>", "/u/:a-:b", "/plus/+"} {
				app.Post(p, h)
			}
			url, _ := listen(t, app, 0)
			for _, p := range []string{"/payments", "/payments/", "/payments//", "/payments///", "/Payments", "/PAYMENTS//",
				"/orders/1", "/orders/1/", "/orders/1//", "/orders/%31", "/orders/a%2Fb", "/pay%6Dents", "/files/a/b", "/files/", "/files", "/files//",
				"/opt", "/opt/", "/opt//", "/opt/5", "/opt/5//", "/c/12", "/c/12//", "/u/x-y", "/u/x-y//", "/plus/a", "/plus/a//", "//payments", "/./payments"} {
				if s, _, body := rawDo(t, url, rawPost(p, "", "", `{}`)); s == 201 {
					t.Errorf("POST %s without a key ran unprotected: %d %q", p, s, body)
				}
			}
		})
	}
}

// TestUseThenRewrite: installed with app.Use ahead of a middleware that
// rewrites the path (Fiber's rewrite), a request that matches no route
// yet, but that the rewrite may move onto one, is refused with a 500
// not-protected and never runs, also when Fiber merges the two Use
// calls into one route; installed after the rewrite, the same request is
// protected (run once, then replayed). A request that reaches no route
// gets Fiber's own 404 unless a later middleware runs for its path.
func TestUseThenRewrite(t *testing.T) {
	for _, tc := range []struct {
		name     string
		install  func(app *fiber.App, idem fiber.Handler)
		path     string // the route is POST /v1/payments; the request goes to path
		nowhere  int    // the status of POST /nowhere
		refusing bool
	}{
		{"rewrite after, for the app (one merged Use route)", func(app *fiber.App, idem fiber.Handler) {
			app.Use(idem)
			app.Use(rewrite.New(rewrite.Config{Rules: map[string]string{"/old/payments": "/v1/payments"}}))
		}, "/old/payments", 500, true},
		{"rewrite after, for a group", func(app *fiber.App, idem fiber.Handler) {
			app.Use(idem)
			// In the same stack as the route (Fiber continues a rewritten
			// request in the stack of its new path's first characters).
			app.Use("/v1", rewrite.New(rewrite.Config{Rules: map[string]string{"/v1/pay": "/v1/payments"}}))
		}, "/v1/pay", 404, true},
		{"rewrite before", func(app *fiber.App, idem fiber.Handler) {
			app.Use(rewrite.New(rewrite.Config{Rules: map[string]string{"/old/payments": "/v1/payments"}}))
			app.Use(idem)
		}, "/old/payments", 404, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var n atomic.Int32
			app := fiber.New()
			tc.install(app, fiberidem.New(singleCaller(t)))
			app.Post("/v1/payments", func(c fiber.Ctx) error {
				return c.Status(201).SendString(fmt.Sprintf("charge %d", n.Add(1)))
			})
			url, _ := listen(t, app, 0)
			req := rawPost(tc.path, core.HeaderKey, "pay-1", `{"amount":100}`)
			s1, _, b1 := rawDo(t, url, req)
			s2, rep, b2 := rawDo(t, url, req)
			if tc.refusing {
				for _, a := range []struct {
					s int
					b string
				}{{s1, b1}, {s2, b2}} {
					if a.s != 500 || !strings.Contains(a.b, "not-protected") {
						t.Errorf("POST %s: %d %q, want 500 not-protected", tc.path, a.s, a.b)
					}
				}
				if n.Load() != 0 {
					t.Errorf("the handler ran %d times, want never", n.Load())
				}
			} else if s1 != 201 || s2 != 201 || rep != "true" || b1 != b2 || n.Load() != 1 {
				t.Errorf("first %d %q; retry %d replayed=%q %q; the handler ran %d times, want once and a replay", s1, b1, s2, rep, b2, n.Load())
			}
			if s, _, b := rawDo(t, url, rawPost("/nowhere", core.HeaderKey, "k", `{}`)); s != tc.nowhere {
				t.Errorf("POST /nowhere: %d %q, want %d", s, b, tc.nowhere)
			}
		})
	}
}

// TestKeyOptionalHeaderSpelling: with core.KeyOptional, a key sent in a
// field spelled in another case ("idempotency-key", as HTTP/2 clients
// and many proxies send it) protects the request, also when the app
// disables Fiber's header normalizing; a request without it passes
// through.
func TestKeyOptionalHeaderSpelling(t *testing.T) {
	for _, cfg := range []fiber.Config{{}, {DisableHeaderNormalizing: true}} {
		t.Run(fmt.Sprintf("DisableHeaderNormalizing=%v", cfg.DisableHeaderNormalizing), func(t *testing.T) {
			var n atomic.Int32
			app := fiber.New(cfg)
			app.Post("/payments", fiberidem.New(singleCaller(t), core.KeyOptional()), func(c fiber.Ctx) error {
				return c.Status(201).SendString(fmt.Sprintf("charge %d", n.Add(1)))
			})
			url, _ := listen(t, app, 0)
			for i, field := range []string{"idempotency-key", "IDEMPOTENCY-KEY", "Idempotency-Key"} {
				req := rawPost("/payments", field, fmt.Sprint("pay-", i), `{"amount":100}`)
				s1, _, b1 := rawDo(t, url, req)
				s2, rep, b2 := rawDo(t, url, req)
				if s1 != 201 || s2 != 201 || rep != "true" || b1 != b2 {
					t.Errorf("key in %q: first %d %q; retry %d replayed=%q %q, want a replay", field, s1, b1, s2, rep, b2)
				}
			}
			before := n.Load()
			rawDo(t, url, rawPost("/payments", "", "", `{}`))
			if s, rep, _ := rawDo(t, url, rawPost("/payments", "", "", `{}`)); s != 201 || rep != "" || n.Load() != before+2 {
				t.Errorf("without a key: %d replayed=%q, ran %d times, want 201 twice, passed through", s, rep, n.Load()-before)
			}
		})
	}
}

// TestAcrossNetHTTPPathAsSent: a request sent to a net/http replica and
// retried, byte for byte the same, on a Fiber replica over the same store
// (or the other way round) is replayed, whatever characters its path
// holds as sent: the engine's view of a Fiber request has the URL
// net/http parses from it (Path and RawPath alike), so both fingerprint
// it the same.
func TestAcrossNetHTTPPathAsSent(t *testing.T) {
	st := memstore.New()
	var n atomic.Int32
	mux := http.NewServeMux()
	mux.Handle("POST /orders/{id}", singleCallerOn(t, st).Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(201)
		fmt.Fprintf(w, "charge %d path=%q", n.Add(1), r.URL.Path)
	})))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: mux}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	netHTTPURL := "http://" + ln.Addr().String()

	app := fiber.New()
	app.Post("/orders/:id", fiberidem.New(singleCallerOn(t, st)), func(c fiber.Ctx) error {
		return c.Status(201).SendString(fmt.Sprintf("charge %d path=%q", n.Add(1), c.Path()))
	})
	fiberURL, _ := listen(t, app, 0)

	paths := []string{"/orders/1", "/orders/a%2Fb", "/orders/caf%C3%A9", "/orders/%7e", "/orders/a!b", "/orders/(1)", "/orders/a'b", "/orders/a*b", "/orders/caf\xc3\xa9"}
	for i, p := range paths {
		for dir, pair := range [][2]string{{netHTTPURL, fiberURL}, {fiberURL, netHTTPURL}} {
			req := rawPost(p, core.HeaderKey, fmt.Sprintf("k-%d-%d", i, dir), `{"amount":100}`)
			s1, _, b1 := rawDo(t, pair[0], req)
			s2, rep, b2 := rawDo(t, pair[1], req)
			if s1 != 201 || s2 != 201 || rep != "true" || b1 != b2 {
				t.Errorf("%s %q: first %d %q; retry on the other replica %d replayed=%q %q, want a replay",
					[2]string{"nethttp→fiber", "fiber→nethttp"}[dir], p, s1, b1, s2, rep, b2)
			}
		}
	}
}

func singleCallerOn(t *testing.T, st *memstore.Store) *core.Engine {
	t.Helper()
	e, err := core.New(st, core.WithSingleCaller())
	if err != nil {
		t.Fatal(err)
	}
	return e
}
