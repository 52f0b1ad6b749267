package echo5idem_test

import (
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

// TestWithinEchoHandler: echo5idem.Within runs an Echo handler as Echo
// does, inside the service's transaction: it binds with c.Bind, answers
// with c.JSON, finds the transaction and the attempt in
// c.Request().Context(), and an error it returns goes through the app's
// HTTPErrorHandler inside the capture, so that answer is recorded and
// replayed too.
func TestWithinEchoHandler(t *testing.T) {
	e, err := core.New(memstore.New().Atomic(), core.WithSingleCaller())
	if err != nil {
		t.Fatal(err)
	}
	inTx, route := scenario.StoreTx(e), e.Route()
	runs := 0
	create := func(c *echo.Context) error {
		runs++
		info, ok := core.AttemptFrom(c.Request().Context())
		if !ok || !info.Atomic || !e.Store().(store.TxStore).InTx(c.Request().Context()) {
			return echo.NewHTTPError(http.StatusInternalServerError, "no transaction in the handler's context")
		}
		var in struct{ Item string }
		if err := c.Bind(&in); err != nil {
			return err
		}
		if in.Item == "" {
			return echo.NewHTTPError(http.StatusConflict, "out of stock")
		}
		return c.JSON(http.StatusCreated, map[string]string{"item": in.Item})
	}
	r := echo.New()
	r.HTTPErrorHandler = func(c *echo.Context, err error) {
		he, _ := err.(*echo.HTTPError)
		_ = c.JSON(he.Code, map[string]any{"error": he.Message, "handled_by": "app"})
	}
	r.POST("/orders", func(c *echo.Context) error { return echo5idem.Within(c, route, inTx, create) })

	do := func(key, body string) *httptest.ResponseRecorder {
		req := httptest.NewRequest("POST", "/orders", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set(core.HeaderKey, key)
		w := httptest.NewRecorder()
		r.ServeHTTP(w, req)
		return w
	}
	for _, tt := range []struct {
		key, body, want string
		status          int
	}{
		{"k1", `{"item":"coffee"}`, `{"item":"coffee"}`, http.StatusCreated},
		{"k2", `{}`, `{"error":"out of stock","handled_by":"app"}`, http.StatusConflict},
	} {
		first, again := do(tt.key, tt.body), do(tt.key, tt.body)
		if first.Code != tt.status || strings.TrimSpace(first.Body.String()) != tt.want || adaptertest.Replayed(first) {
			t.Errorf("%s: %d %q, want %d %s", tt.key, first.Code, first.Body, tt.status, tt.want)
		}
		if again.Code != first.Code || again.Body.String() != first.Body.String() || !adaptertest.Replayed(again) {
			t.Errorf("%s replay: %d %q replayed=%v, want the first answer replayed", tt.key, again.Code, again.Body, adaptertest.Replayed(again))
		}
	}
	if runs != 2 {
		t.Errorf("the handler ran %d times, want 2", runs)
	}
}
