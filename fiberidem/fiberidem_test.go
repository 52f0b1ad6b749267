package fiberidem_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gofiber/fiber/v3"
	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/memstore"
	"github.com/idemkit/idem/core/observe"
	"github.com/idemkit/idem/core/scenario"
	"github.com/idemkit/idem/core/store"
	"github.com/idemkit/idem/fiberidem"
)

// listen serves app on a real fasthttp listener on loopback and returns
// its base URL and a client with connections of its own (at most conns,
// 0: no limit); when the test ends the client's idle connections are
// closed and the server stops (Shutdown waits for open connections).
func listen(t *testing.T, app *fiber.App, conns int) (string, *http.Client) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = app.Listener(ln, fiber.ListenConfig{DisableStartupMessage: true}) }()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: max(conns, 64), MaxConnsPerHost: conns}}
	t.Cleanup(func() {
		client.CloseIdleConnections()
		_ = app.ShutdownWithTimeout(10 * time.Second)
	})
	return "http://" + ln.Addr().String(), client
}

func engine(t *testing.T, store store.Store, opts ...core.Option) *core.Engine {
	t.Helper()
	e, err := core.New(store, append([]core.Option{core.WithCaller(func(r *http.Request) (string, error) {
		return r.Header.Get("X-Caller"), nil
	})}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

type answer struct {
	status   int
	body     string
	replayed bool
}

func send(t *testing.T, client *http.Client, method, url, caller, key, body string) answer {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if caller != "" {
		req.Header.Set("X-Caller", caller)
	}
	if key != "" {
		req.Header.Set(core.HeaderKey, key)
	}
	res, err := client.Do(req)
	if err != nil {
		t.Error(err)
		return answer{}
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return answer{res.StatusCode, string(b), res.Header.Get(core.HeaderReplayed) == "true"}
}

// TestListenerConcurrentDuplicates: of 50 concurrent identical requests
// to a real Fiber server, exactly one runs the handler; every other gets
// its 201 replayed or a 409 in-progress (run with -race).
func TestListenerConcurrentDuplicates(t *testing.T) {
	for _, mode := range []struct {
		name  string
		store store.Store
	}{{"leased", memstore.New()}, {"atomic", memstore.New().Atomic()}} {
		t.Run(mode.name, func(t *testing.T) {
			e := engine(t, mode.store)
			var runs atomic.Int32
			app := fiber.New()
			app.Use(fiberidem.New(e))
			app.Post("/orders", func(c fiber.Ctx) error {
				runs.Add(1)
				return c.Status(http.StatusCreated).JSON(fiber.Map{"order": 1})
			})
			base, client := listen(t, app, 0)
			url := base + "/orders"
			var wg sync.WaitGroup
			answers := make([]answer, 50)
			for i := range answers {
				wg.Go(func() { answers[i] = send(t, client, "POST", url, "alice", "k1", `{"item":"coffee"}`) })
			}
			wg.Wait()
			if n := runs.Load(); n != 1 {
				t.Errorf("the handler ran %d times, want 1", n)
			}
			for _, a := range answers {
				if a.status != http.StatusCreated && a.status != http.StatusConflict {
					t.Errorf("an answer: %d %s, want 201 or 409", a.status, a.body)
				}
				if a.status == http.StatusCreated && a.body != `{"order":1}` {
					t.Errorf("a 201 with body %q", a.body)
				}
			}
		})
	}
}

// TestListenerBuffersReused: fasthttp reuses a connection's request and
// response buffers for the next request once the handler returned. Many
// concurrent requests, each with its own caller, key and body, over a few
// keep-alive connections: every record keeps its own identity and answer
// (what the engine keeps was copied out of Fiber's buffers), and every
// replay is its own request's answer.
func TestListenerBuffersReused(t *testing.T) {
	st := memstore.New()
	var mu sync.Mutex
	var events []observe.Event
	e := engine(t, st, core.WithObserver(func(_ context.Context, ev observe.Event) {
		mu.Lock()
		events = append(events, ev)
		mu.Unlock()
	}))
	app := fiber.New()
	app.Use(fiberidem.New(e))
	app.Post("/orders/:id", func(c fiber.Ctx) error {
		c.Set("Location", "/orders/"+c.Params("id"))
		return c.Status(http.StatusCreated).Send(c.Body()) // echoes the body: Fiber's buffer, copied by the engine
	})
	url, client := listen(t, app, 4)

	const workers, each = 8, 40
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range each {
				caller, key := fmt.Sprintf("caller-%d", w), fmt.Sprintf("key-%d-%d", w, i)
				body := fmt.Sprintf(`{"worker":%d,"n":%d,"pad":"%s"}`, w, i, strings.Repeat("x", (w*each+i)%97))
				path := fmt.Sprintf("/orders/%d", w*each+i)
				first := send(t, client, "POST", url+path, caller, key, body)
				again := send(t, client, "POST", url+path, caller, key, body)
				if first.status != http.StatusCreated || first.body != body || first.replayed {
					t.Errorf("%s %s: first %+v, want 201 with its own body", caller, key, first)
				}
				if again.status != http.StatusCreated || again.body != body || !again.replayed {
					t.Errorf("%s %s: replay %+v, want its own 201 replayed", caller, key, again)
				}
			}
		})
	}
	wg.Wait()

	ctx := context.Background()
	callers := map[store.ID]string{}
	for w := range workers {
		for i := range each {
			caller := fmt.Sprintf("caller-%d", w)
			id := store.Identity{Caller: caller, Key: fmt.Sprintf("key-%d-%d", w, i)}.ID()
			callers[id] = caller
			rec, err := st.Get(ctx, id, time.Now())
			if err != nil || rec.State != store.StateCompleted {
				t.Fatalf("record of %s key-%d-%d: %+v (%v)", caller, w, i, rec, err)
			}
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(events) != 2*workers*each {
		t.Errorf("%d events, want %d", len(events), 2*workers*each)
	}
	for _, ev := range events {
		if caller, ok := callers[ev.ID]; !ok || ev.Caller != caller || ev.Route != "/orders/:id" {
			t.Errorf("an event kept caller %q, route %q for record %s (of %q): overwritten by a later request", ev.Caller, ev.Route, ev.ID, caller)
		}
	}
}

// TestFiberWay: a handler answers with Fiber's API; an error it returns
// goes through the app's ErrorHandler inside the capture (recorded,
// replayed); the attempt and DownstreamKey are reachable from c; Caller
// reads c.Locals.
func TestFiberWay(t *testing.T) {
	e, err := core.New(memstore.New(), core.WithCaller(fiberidem.Caller(func(c fiber.Ctx) (string, error) {
		account, _ := c.Locals("account").(string)
		return account, nil
	})))
	if err != nil {
		t.Fatal(err)
	}
	var runs atomic.Int32
	app := fiber.New(fiber.Config{ErrorHandler: func(c fiber.Ctx, err error) error {
		var fe *fiber.Error
		if errors.As(err, &fe) {
			return c.Status(fe.Code).JSON(fiber.Map{"error": fe.Message})
		}
		return c.Status(http.StatusInternalServerError).SendString("internal")
	}})
	app.Use(func(c fiber.Ctx) error {
		c.Locals("account", c.Get("X-Caller")+"") // a value of the request, stored by an authentication middleware
		return c.Next()
	})
	app.Use(fiberidem.New(e))
	app.Post("/orders", func(c fiber.Ctx) error {
		runs.Add(1)
		info, ok := core.AttemptFrom(c.Context())
		dk, err := fiberidem.DownstreamKey(c, "charge")
		if !ok || err != nil || dk == "" || info.Identity.Caller != "alice" {
			return fmt.Errorf("no attempt in c.Context(): %+v %v %q", info, err, dk)
		}
		var in struct{ Item string }
		if err := c.Bind().JSON(&in); err != nil {
			return err
		}
		if in.Item == "" {
			return fiber.NewError(http.StatusConflict, "no item") // recorded: a 409 completes the record
		}
		c.Set("Location", "/orders/1")
		return c.Status(http.StatusCreated).JSON(fiber.Map{"item": in.Item})
	})
	base, client := listen(t, app, 0)
	url := base + "/orders"

	first := send(t, client, "POST", url, "alice", "k1", `{"item":"coffee"}`)
	if first.status != http.StatusCreated || first.body != `{"item":"coffee"}` || first.replayed {
		t.Fatalf("first: %+v", first)
	}
	if again := send(t, client, "POST", url, "alice", "k1", `{"item":"coffee"}`); again != (answer{first.status, first.body, true}) {
		t.Errorf("replay: %+v, want %+v replayed", again, first)
	}
	failed := send(t, client, "POST", url, "alice", "k2", `{}`)
	if failed.status != http.StatusConflict || failed.body != `{"error":"no item"}` {
		t.Fatalf("an error returned: %+v, want the ErrorHandler's 409", failed)
	}
	if again := send(t, client, "POST", url, "alice", "k2", `{}`); again != (answer{failed.status, failed.body, true}) {
		t.Errorf("replay of the error: %+v, want %+v replayed", again, failed)
	}
	if noCaller := send(t, client, "POST", url, "", "k3", `{}`); noCaller.status != http.StatusUnauthorized {
		t.Errorf("without a caller: %+v, want 401", noCaller)
	}
	if n := runs.Load(); n != 2 {
		t.Errorf("the handler ran %d times, want 2", n)
	}
}

// TestNextAndRouting: Config.Next leaves requests out; a global install
// passes Fiber's own 404 and 405 through, in groups too; a group's
// install protects its routes only.
func TestNextAndRouting(t *testing.T) {
	e := engine(t, memstore.New())
	var runs atomic.Int32
	h := func(c fiber.Ctx) error { runs.Add(1); return c.Status(http.StatusCreated).SendString("ok") }
	app := fiber.New()
	app.Use(fiberidem.NewWithConfig(fiberidem.Config{Engine: e, Next: func(c fiber.Ctx) bool {
		return strings.HasPrefix(c.Path(), "/webhooks/")
	}}))
	app.Post("/webhooks/:provider", h)
	app.Post("/orders", h)
	api := app.Group("/api")
	api.Post("/items/:id", h)
	url, client := listen(t, app, 0)

	for i := range 2 {
		if a := send(t, client, "POST", url+"/webhooks/stripe", "alice", "", `{}`); a.status != http.StatusCreated || a.replayed {
			t.Errorf("skipped route, request %d: %+v, want 201 without a key", i, a)
		}
	}
	if a := send(t, client, "POST", url+"/orders", "alice", "", `{}`); a.status != http.StatusBadRequest {
		t.Errorf("protected route without a key: %+v, want 400", a)
	}
	for _, p := range []string{"/nowhere", "/api/nowhere", "/api/items"} {
		if a := send(t, client, "POST", url+p, "alice", "", `{}`); a.status != http.StatusNotFound {
			t.Errorf("POST %s: %+v, want Fiber's 404", p, a)
		}
	}
	if a := send(t, client, "PATCH", url+"/orders", "alice", "k9", `{}`); a.status != http.StatusMethodNotAllowed {
		t.Errorf("PATCH /orders: %+v, want Fiber's 405", a)
	}
	first := send(t, client, "POST", url+"/api/items/7", "alice", "k1", `{}`)
	if again := send(t, client, "POST", url+"/api/items/7", "alice", "k1", `{}`); first.status != http.StatusCreated || !again.replayed {
		t.Errorf("group route: %+v then %+v, want 201 then its replay", first, again)
	}
	if n := runs.Load(); n != 3 {
		t.Errorf("the handlers ran %d times, want 3", n)
	}
}

// TestStreamLeased: in leased mode a streamed answer (SendStreamWriter)
// reaches the client as a stream and is not kept: a duplicate gets its
// status with a response-not-kept problem.
func TestStreamLeased(t *testing.T) {
	e := engine(t, memstore.New())
	app := fiber.New()
	app.Post("/exports", fiberidem.New(e), func(c fiber.Ctx) error {
		c.Status(http.StatusCreated)
		return c.SendStreamWriter(func(w *bufio.Writer) {
			for i := range 3 {
				fmt.Fprintf(w, "part %d;", i)
				_ = w.Flush()
			}
		})
	})
	base, client := listen(t, app, 0)
	url := base + "/exports"
	if a := send(t, client, "POST", url, "alice", "k1", `{}`); a.status != http.StatusCreated || a.body != "part 0;part 1;part 2;" {
		t.Fatalf("first: %+v", a)
	}
	dup := send(t, client, "POST", url, "alice", "k1", `{}`)
	if dup.status != http.StatusCreated || !dup.replayed || !strings.Contains(dup.body, "response-not-kept") {
		t.Errorf("duplicate: %+v, want 201 replayed with a response-not-kept problem", dup)
	}
}

func TestNilEngine(t *testing.T) {
	_, err := fiberidem.Config{}.ToMiddleware()
	if !errors.Is(err, core.ErrConfig) {
		t.Fatalf("ToMiddleware with no engine: %v, want core.ErrConfig", err)
	}
	defer func() {
		if v := recover(); v == nil {
			t.Fatal("New(nil) did not panic")
		}
	}()
	fiberidem.New(nil)
}

// TestWithinFiberHandler: fiberidem.Within runs a Fiber handler inside
// the service's transaction: c.Bind, c.JSON, the transaction and the
// attempt in c.Context(), and an error returned through the app's
// ErrorHandler, recorded and replayed.
func TestWithinFiberHandler(t *testing.T) {
	e, err := core.New(memstore.New().Atomic(), core.WithSingleCaller())
	if err != nil {
		t.Fatal(err)
	}
	inTx, route := scenario.StoreTx(e), e.Route()
	var runs atomic.Int32
	create := func(c fiber.Ctx) error {
		runs.Add(1)
		if info, ok := core.AttemptFrom(c.Context()); !ok || !info.Atomic || !e.Store().(store.TxStore).InTx(c.Context()) {
			return errors.New("no transaction in c.Context()")
		}
		var in struct{ Item string }
		if err := c.Bind().JSON(&in); err != nil {
			return err
		}
		if in.Item == "" {
			return fiber.NewError(http.StatusConflict, "out of stock")
		}
		return c.Status(http.StatusCreated).JSON(fiber.Map{"item": in.Item})
	}
	app := fiber.New()
	app.Post("/orders", func(c fiber.Ctx) error { return fiberidem.Within(c, route, inTx, create) })
	base, client := listen(t, app, 0)
	url := base + "/orders"
	for _, tt := range []struct {
		key, body, want string
		status          int
	}{
		{"k1", `{"item":"coffee"}`, `{"item":"coffee"}`, http.StatusCreated},
		{"k2", `{}`, "out of stock", http.StatusConflict}, // Fiber's DefaultErrorHandler
	} {
		first := send(t, client, "POST", url, "", tt.key, tt.body)
		again := send(t, client, "POST", url, "", tt.key, tt.body)
		if first != (answer{tt.status, tt.want, false}) {
			t.Errorf("%s: %+v, want %d %s", tt.key, first, tt.status, tt.want)
		}
		if again != (answer{first.status, first.body, true}) {
			t.Errorf("%s replay: %+v, want the first answer replayed", tt.key, again)
		}
	}
	if n := runs.Load(); n != 2 {
		t.Errorf("the handler ran %d times, want 2", n)
	}
}
