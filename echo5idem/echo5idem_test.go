package echo5idem_test

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/memstore"
	"github.com/idemkit/idem/core/scenario"
	"github.com/idemkit/idem/core/store"
	"github.com/idemkit/idem/echo5idem"
	"github.com/idemkit/idem/internal/adaptertest"
	"github.com/labstack/echo/v5"
)

// counter is a handler that counts its runs and answers 201 with the count.
func counter(n *int) echo.HandlerFunc {
	return func(c *echo.Context) error {
		*n++
		return c.JSON(http.StatusCreated, map[string]any{"run": *n, "id": c.Param("id")})
	}
}

// same reports whether a replay equals the first answer.
func same(first, replay *httptest.ResponseRecorder) bool {
	return adaptertest.Replayed(replay) && first.Code == replay.Code && first.Body.String() == replay.Body.String() &&
		first.Header().Get("Content-Type") == replay.Header().Get("Content-Type")
}

// customErrors is an application's HTTPErrorHandler: its own JSON shape and
// a header.
func customErrors(c *echo.Context, err error) {
	if r, _ := echo.UnwrapResponse(c.Response()); r != nil && r.Committed {
		return
	}
	code := echo.StatusCode(err)
	if code == 0 {
		code = http.StatusInternalServerError
	}
	c.Response().Header().Set("Content-Language", "en")
	_ = c.JSON(code, map[string]string{"error": err.Error(), "path": c.Path()})
}

func TestReturnedErrorsAreRecorded(t *testing.T) {
	tests := []struct {
		name     string
		store    func() store.Store
		handler  func(n int) error
		errors   echo.HTTPErrorHandler // nil: Echo's default
		code     int
		body     string
		runsTwo  bool // the retry executes again (released), instead of replaying
		retryRan int
	}{
		{name: "ok, an HTTPError is recorded as Echo's default handler sends it",
			handler: func(int) error { return echo.NewHTTPError(http.StatusConflict, "out of stock") },
			code:    409, body: `{"message":"out of stock"}` + "\n"},
		{name: "ok, an HTTPError through a custom error handler",
			handler: func(int) error { return echo.NewHTTPError(http.StatusForbidden, "iban blocked") },
			errors:  customErrors,
			code:    403, body: `{"error":"code=403, message=iban blocked","path":"/orders/:id"}` + "\n"},
		{name: "ok, a validation failure (422 before MarkEffect) is not saved: the corrected retry runs",
			handler: func(int) error { return echo.NewHTTPError(http.StatusUnprocessableEntity, "bad iban") },
			errors:  customErrors,
			code:    422, body: `{"error":"code=422, message=bad iban","path":"/orders/:id"}` + "\n", runsTwo: true},
		{name: "ok, a plain error is the 500 the error handler sends; leased, before MarkEffect: released, the retry runs",
			handler: func(int) error { return errors.New("db down") },
			code:    500, body: `{"message":"Internal Server Error"}` + "\n", runsTwo: true},
		{name: "ok, a plain error in atomic mode: 500, released, the retry runs",
			store:   func() store.Store { return memstore.New().Atomic() },
			handler: func(n int) error { return fmt.Errorf("attempt %d failed", n) },
			code:    500, body: `{"message":"Internal Server Error"}` + "\n", runsTwo: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var st store.Store
			if tt.store != nil {
				st = tt.store()
			}
			e, _ := adaptertest.NewEngine(t, st)
			n := 0
			var outerErr []error
			r := echo.New()
			if tt.errors != nil {
				r.HTTPErrorHandler = tt.errors
			}
			r.Use(func(next echo.HandlerFunc) echo.HandlerFunc {
				return func(c *echo.Context) error {
					err := next(c)
					outerErr = append(outerErr, err)
					return err
				}
			})
			r.POST("/orders/:id", func(c *echo.Context) error { n++; return tt.handler(n) }, echo5idem.New(e))
			first, second := adaptertest.Do(r, "POST", "/orders/1", "k"), adaptertest.Do(r, "POST", "/orders/1", "k")
			if first.Code != tt.code || first.Body.String() != tt.body {
				t.Fatalf("first %d %q, want %d %q", first.Code, first.Body, tt.code, tt.body)
			}
			if tt.runsTwo {
				if adaptertest.Replayed(second) || n != 2 {
					t.Fatalf("retry replayed=%v runs=%d, want a second execution", adaptertest.Replayed(second), n)
				}
			} else if !same(first, second) || n != 1 || second.Header().Get("Content-Language") != first.Header().Get("Content-Language") {
				t.Fatalf("replay %d %q %v, runs %d; want the first answer again", second.Code, second.Body, second.Header(), n)
			}
			if outerErr[0] != nil || outerErr[1] != nil {
				t.Fatalf("the middleware returned %v, want nil (the error is answered inside the capture)", outerErr)
			}
		})
	}
}

func TestRestoreAndHooks(t *testing.T) {
	e, _ := adaptertest.NewEngine(t, nil)
	n, hooks := 0, 0
	var status int
	var attempt, ownReq bool
	r := echo.New()
	r.Use(func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c *echo.Context) error {
			req, res := c.Request(), c.Response()
			er, err := echo.UnwrapResponse(res)
			if err != nil {
				return err
			}
			er.Before(func() { hooks++ })
			err = next(c)
			_, attempt = core.AttemptFrom(c.Request().Context())
			ownReq = c.Request() == req && c.Response() == res
			status = er.Status
			return err
		}
	}, echo5idem.New(e))
	r.POST("/orders", counter(&n))
	for i, name := range []string{"ok, the first answer", "ok, the replay"} {
		t.Run(name, func(t *testing.T) {
			hooks = 0
			w := adaptertest.Do(r, "POST", "/orders", "k")
			if w.Code != 201 || status != 201 || attempt || !ownReq || hooks != 1 || adaptertest.Replayed(w) != (i == 1) {
				t.Fatalf("code %d, outer saw status %d attempt=%v own request/response=%v, Before hooks %d", w.Code, status, attempt, ownReq, hooks)
			}
		})
	}
}

func TestCaller(t *testing.T) {
	e, err := core.New(memstore.New(), core.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))),
		core.WithCaller(echo5idem.Caller(func(c *echo.Context) (string, error) {
			account, _ := c.Get("account").(string)
			return account, nil
		})))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	r := echo.New()
	r.Use(func(next echo.HandlerFunc) echo.HandlerFunc { // the application's auth middleware
		return func(c *echo.Context) error {
			if a := c.Request().Header.Get("X-Account"); a != "" {
				c.Set("account", a)
			}
			return next(c)
		}
	}, echo5idem.New(e))
	r.POST("/orders", counter(&n))
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
	// Outside the middleware (and echo5idem.Within) there is no Echo context:
	// a wiring fault of the server, refused as not-protected.
	if _, err := echo5idem.Caller(func(*echo.Context) (string, error) { return "x", nil })(httptest.NewRequest("POST", "/", nil)); !errors.Is(err, core.ErrNotProtected) {
		t.Fatalf("nok, Caller outside the middleware: %v, want ErrNotProtected", err)
	}
}

// TestPassThroughKeepsTheError: a request the middleware passes through
// (a method it does not cover, a route Echo does not know) returns the
// handler's or the router's error to the middleware before it, as without
// the middleware (Echo's own way to answer; the scenario suite checks the
// answers: DefaultMethods, RouterAnswersUntouched).
func TestPassThroughKeepsTheError(t *testing.T) {
	e, ev := adaptertest.NewEngine(t, nil)
	n := 0
	var outerErr error
	r := echo.New()
	r.Use(func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c *echo.Context) error { outerErr = next(c); return outerErr }
	}, echo5idem.New(e))
	teapot := echo.NewHTTPError(http.StatusTeapot, "short and stout")
	r.GET("/orders/:id", func(c *echo.Context) error { n++; return teapot })
	tests := []struct {
		name, method, path string
		code               int
		err                error
	}{
		{"ok, a method that is not covered runs every time and its error goes out", "GET", "/orders/1", 418, teapot},
		{"ok, an unknown route is Echo's 404", "POST", "/nope", 404, echo.ErrNotFound},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for range 2 {
				if w := adaptertest.Do(r, tt.method, tt.path, "k"); w.Code != tt.code || adaptertest.Replayed(w) || !errors.Is(outerErr, tt.err) {
					t.Fatalf("%d replayed=%v error %v, want %d untouched with %v", w.Code, adaptertest.Replayed(w), outerErr, tt.code, tt.err)
				}
			}
		})
	}
	if n != 2 || ev.Len() != 0 {
		t.Fatalf("runs %d, %d decisions (the last labelled %q); want 2 runs and no decision", n, ev.Len(), ev.Route())
	}
}

func TestConfig(t *testing.T) {
	if _, err := (echo5idem.Config{}).ToMiddleware(); !errors.Is(err, core.ErrConfig) {
		t.Fatalf("nok, ToMiddleware without an engine: %v, want ErrConfig", err)
	}
	defer func() {
		if err, _ := recover().(error); !errors.Is(err, core.ErrConfig) {
			t.Fatalf("recovered %v, want ErrConfig", err)
		}
	}()
	echo5idem.New(nil)
}

// TestCallerUnderWithin: echo5idem.Caller reads the Echo context, which
// core.Route.Within called by hand from an Echo handler cannot reach: the
// request is refused with a 500 not-protected problem and a WARN that
// names the fix (echo5idem.Within), never answered 401 with the reason at
// DEBUG; the handler does not run. Through echo5idem.Within the caller is
// found: each caller runs once, and its retry replays.
func TestCallerUnderWithin(t *testing.T) {
	logs := &adaptertest.Logs{}
	e, err := core.New(memstore.New().Atomic(), core.WithLogger(slog.New(logs)),
		core.WithCaller(echo5idem.Caller(func(c *echo.Context) (string, error) {
			account, _ := c.Get("account").(string)
			return account, nil
		})))
	if err != nil {
		t.Fatal(err)
	}
	inTx, route := scenario.StoreTx(e), e.Route()
	n := 0
	r := echo.New()
	r.Use(func(next echo.HandlerFunc) echo.HandlerFunc { // the application's auth
		return func(c *echo.Context) error {
			c.Set("account", c.Request().Header.Get("X-Account"))
			return next(c)
		}
	})
	created := func(w http.ResponseWriter, r *http.Request) { n++; w.WriteHeader(http.StatusCreated) }
	r.POST("/by-hand", func(c *echo.Context) error {
		route.Within(c.Response(), c.Request(), inTx, created)
		return nil
	})
	w := adaptertest.Do(r, "POST", "/by-hand", "k1", "X-Account", "alice")
	if w.Code != http.StatusInternalServerError || !strings.Contains(w.Body.String(), "not-protected") || n != 0 {
		t.Errorf("Route.Within by hand with echo5idem.Caller: %d %q, runs %d; want a 500 not-protected problem and no run", w.Code, w.Body, n)
	}
	if lvl, ok := logs.Find("echo5idem.Within"); !ok || lvl < slog.LevelWarn {
		t.Errorf("the log names the fix at %v (found %v), want WARN or above", lvl, ok)
	}

	r.POST("/within", func(c *echo.Context) error { return echo5idem.Within(c, route, inTx, counter(&n)) })
	for _, tt := range []struct {
		account  string
		replayed bool
		runs     int
	}{{"alice", false, 1}, {"alice", true, 1}, {"bob", false, 2}} {
		w := adaptertest.Do(r, "POST", "/within", "k2", "X-Account", tt.account)
		if w.Code != http.StatusCreated || adaptertest.Replayed(w) != tt.replayed || n != tt.runs {
			t.Errorf("echo5idem.Within as %s: %d %q replayed=%v, runs %d; want 201 replayed=%v, runs %d", tt.account, w.Code, w.Body, adaptertest.Replayed(w), n, tt.replayed, tt.runs)
		}
	}
}
