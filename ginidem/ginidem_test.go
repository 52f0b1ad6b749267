package ginidem_test

import (
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/gin-gonic/gin"
	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/memstore"
	"github.com/idemkit/idem/core/scenario"
	"github.com/idemkit/idem/ginidem"
	"github.com/idemkit/idem/internal/adaptertest"
)

// counter is a handler that counts its runs and answers 201 with the count.
func counter(n *int) gin.HandlerFunc {
	return func(c *gin.Context) {
		*n++
		c.JSON(http.StatusCreated, gin.H{"run": *n, "id": c.Param("id")})
	}
}

func TestAbortAndRestore(t *testing.T) {
	e, _ := adaptertest.NewEngine(t, nil)
	type seen struct {
		aborted  bool
		status   int
		attempt  bool
		ownedCtx bool
	}
	var outer seen
	n, after := 0, 0
	r := gin.New()
	r.Use(func(c *gin.Context) {
		req := c.Request
		c.Next()
		_, attempt := core.AttemptFrom(c.Request.Context())
		outer = seen{aborted: c.IsAborted(), status: c.Writer.Status(), attempt: attempt, ownedCtx: c.Request == req}
	})
	r.POST("/orders", ginidem.New(e), counter(&n), func(c *gin.Context) { after++ })

	tests := []struct {
		name    string
		key     string
		code    int
		aborted bool
		runs    int
	}{
		{"ok, the first request runs the whole chain", "k", 201, false, 1},
		{"ok, a replay aborts the chain", "k", 201, true, 1},
		{"nok, a missing key aborts the chain with 400", "", 400, true, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := adaptertest.Do(r, "POST", "/orders", tt.key)
			if w.Code != tt.code || n != tt.runs || after != tt.runs {
				t.Fatalf("status %d, runs %d/%d; want %d, %d", w.Code, n, after, tt.code, tt.runs)
			}
			want := seen{aborted: tt.aborted, status: tt.code, attempt: false, ownedCtx: true}
			if outer != want {
				t.Fatalf("the outer middleware saw %+v, want %+v (writer and request restored)", outer, want)
			}
		})
	}
}

func TestDeferredHeader(t *testing.T) {
	tests := []struct {
		name    string
		handler gin.HandlerFunc
		code    int
		body    string
	}{
		{"ok, a status without a body (c.Status) is recorded", func(c *gin.Context) {
			c.Status(http.StatusAccepted)
		}, 202, ""},
		{"ok, 204 through c.Status", func(c *gin.Context) {
			c.Status(http.StatusNoContent)
		}, 204, ""},
		{"ok, the pending status can change until the first byte", func(c *gin.Context) {
			c.Writer.WriteHeader(http.StatusCreated)
			if c.Writer.Written() || c.Writer.Status() != http.StatusCreated {
				c.String(500, "pending status not reported")
				return
			}
			c.Writer.WriteHeader(http.StatusAccepted)
			_, _ = c.Writer.WriteString("queued")
			c.Writer.WriteHeader(http.StatusTeapot) // ignored: already written
			if c.Writer.Size() != len("queued") {
				c.Writer.WriteHeader(500)
			}
		}, 202, "queued"},
		{"ok, nothing written is a 200 as Gin sends it", func(c *gin.Context) {}, 200, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e, _ := adaptertest.NewEngine(t, nil)
			r := gin.New()
			r.POST("/x", ginidem.New(e), tt.handler)
			first, second := adaptertest.Do(r, "POST", "/x", "k"), adaptertest.Do(r, "POST", "/x", "k")
			if first.Code != tt.code || first.Body.String() != tt.body {
				t.Fatalf("first %d %q, want %d %q", first.Code, first.Body, tt.code, tt.body)
			}
			if second.Code != tt.code || second.Body.String() != tt.body || !adaptertest.Replayed(second) {
				t.Fatalf("replay %d %q replayed=%v, want %d %q", second.Code, second.Body, adaptertest.Replayed(second), tt.code, tt.body)
			}
		})
	}
}

func TestWriterInterfaces(t *testing.T) {
	e, _ := adaptertest.NewEngine(t, nil)
	r := gin.New()
	r.POST("/stream", ginidem.New(e), func(c *gin.Context) {
		if _, ok := c.Writer.(interface{ Unwrap() http.ResponseWriter }); !ok {
			c.Status(500)
			return
		}
		c.Status(http.StatusOK)
		_, _ = c.Writer.WriteString("part 1,")
		c.Writer.Flush() // must reach the engine's writer: the body is streamed
		_, _ = c.Writer.WriteString("part 2")
		if c.Writer.CloseNotify() == nil {
			panic("no CloseNotify channel")
		}
	})
	first, second := adaptertest.Do(r, "POST", "/stream", "k"), adaptertest.Do(r, "POST", "/stream", "k")
	if first.Code != 200 || first.Body.String() != "part 1,part 2" || !first.Flushed {
		t.Fatalf("ok, the first client gets the stream: %d %q flushed=%v", first.Code, first.Body, first.Flushed)
	}
	if !adaptertest.Replayed(second) || second.Code != 200 || !strings.HasPrefix(second.Header().Get("Content-Type"), "application/problem+json") {
		t.Fatalf("ok, a flushed response is not kept: the replay is %d %q %q", second.Code, second.Header().Get("Content-Type"), second.Body)
	}
}

func TestCaller(t *testing.T) {
	e, err := core.New(memstore.New(), core.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))),
		core.WithCaller(ginidem.Caller(func(c *gin.Context) (string, error) {
			return c.GetString("account"), nil
		})))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	r := gin.New()
	r.Use(func(c *gin.Context) { // the application's auth middleware
		if a := c.GetHeader("X-Account"); a != "" {
			c.Set("account", a)
		}
	})
	r.POST("/orders", ginidem.New(e), counter(&n))

	tests := []struct {
		name     string
		account  string
		code     int
		replayed bool
		runs     int
	}{
		{"ok, alice runs", "alice", 201, false, 1},
		{"ok, bob with alice's key gets his own execution", "bob", 201, false, 2},
		{"ok, alice's retry replays hers", "alice", 201, true, 2},
		{"nok, 401 without an account", "", 401, false, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := adaptertest.Do(r, "POST", "/orders", "k", "X-Account", tt.account)
			if w.Code != tt.code || adaptertest.Replayed(w) != tt.replayed || n != tt.runs {
				t.Fatalf("%d replayed=%v runs=%d, want %d %v %d", w.Code, adaptertest.Replayed(w), n, tt.code, tt.replayed, tt.runs)
			}
		})
	}
	// Outside the middleware (and ginidem.Within) there is no Gin context:
	// a wiring fault of the server, refused as not-protected.
	if _, err := ginidem.Caller(func(*gin.Context) (string, error) { return "x", nil })(httptest.NewRequest("POST", "/", nil)); !errors.Is(err, core.ErrNotProtected) {
		t.Fatalf("nok, Caller outside the middleware: %v, want ErrNotProtected", err)
	}
}

func TestNilEngine(t *testing.T) {
	defer func() {
		if err, _ := recover().(error); !errors.Is(err, core.ErrConfig) {
			t.Fatalf("recovered %v, want ErrConfig", err)
		}
	}()
	ginidem.New(nil)
}

// TestCallerUnderWithin: ginidem.Caller reads the Gin context, which
// core.Route.Within called by hand from a Gin handler cannot reach: the
// request is refused with a 500 not-protected problem and a WARN that
// names the fix (ginidem.Within), never answered 401 with the reason at
// DEBUG; the handler does not run. Through ginidem.Within the caller is
// found: each caller runs once, and its retry replays.
func TestCallerUnderWithin(t *testing.T) {
	logs := &adaptertest.Logs{}
	e, err := core.New(memstore.New().Atomic(), core.WithLogger(slog.New(logs)),
		core.WithCaller(ginidem.Caller(func(c *gin.Context) (string, error) { return c.GetString("account"), nil })))
	if err != nil {
		t.Fatal(err)
	}
	inTx, route := scenario.StoreTx(e), e.Route()
	n := 0
	r := gin.New()
	r.Use(func(c *gin.Context) { c.Set("account", c.GetHeader("X-Account")) }) // the application's auth
	created := func(w http.ResponseWriter, r *http.Request) { n++; w.WriteHeader(http.StatusCreated) }
	r.POST("/by-hand", func(c *gin.Context) { route.Within(c.Writer, c.Request, inTx, created) })
	w := adaptertest.Do(r, "POST", "/by-hand", "k1", "X-Account", "alice")
	if w.Code != http.StatusInternalServerError || !strings.Contains(w.Body.String(), "not-protected") || n != 0 {
		t.Errorf("Route.Within by hand with ginidem.Caller: %d %q, runs %d; want a 500 not-protected problem and no run", w.Code, w.Body, n)
	}
	if lvl, ok := logs.Find("ginidem.Within"); !ok || lvl < slog.LevelWarn {
		t.Errorf("the log names the fix at %v (found %v), want WARN or above", lvl, ok)
	}

	r.POST("/within", func(c *gin.Context) { ginidem.Within(c, route, inTx, counter(&n)) })
	for _, tt := range []struct {
		account  string
		replayed bool
		runs     int
	}{{"alice", false, 1}, {"alice", true, 1}, {"bob", false, 2}} {
		w := adaptertest.Do(r, "POST", "/within", "k2", "X-Account", tt.account)
		if w.Code != http.StatusCreated || adaptertest.Replayed(w) != tt.replayed || n != tt.runs {
			t.Errorf("ginidem.Within as %s: %d %q replayed=%v, runs %d; want 201 replayed=%v, runs %d", tt.account, w.Code, w.Body, adaptertest.Replayed(w), n, tt.replayed, tt.runs)
		}
	}
}
