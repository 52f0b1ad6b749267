package echo5idem_test

import (
	"errors"
	"net/http"
	"testing"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/echo5idem"
	"github.com/idemkit/idem/internal/adaptertest"
	"github.com/labstack/echo/v5"
)

// TestDownstreamKeyFromTheEchoContext: echo5idem.DownstreamKey(c, ...) gives
// the request's key; without a protected request it fails with
// core.ErrNoAttempt instead of returning "".
func TestDownstreamKeyFromTheEchoContext(t *testing.T) {
	e, _ := adaptertest.NewEngine(t, nil)
	var rightKey, reqKey, outsideKey string
	var rightErr, outsideErr error
	ec := echo.New()
	ec.POST("/pay", func(c *echo.Context) error {
		rightKey, rightErr = echo5idem.DownstreamKey(c, "charge")
		reqKey, _ = core.DownstreamKey(c.Request().Context(), "charge")
		return c.NoContent(http.StatusCreated)
	}, echo5idem.New(e))
	ec.POST("/open", func(c *echo.Context) error {
		outsideKey, outsideErr = echo5idem.DownstreamKey(c, "charge")
		return c.NoContent(http.StatusCreated)
	})
	if w := adaptertest.Do(ec, "POST", "/pay", "k1"); w.Code != http.StatusCreated {
		t.Fatalf("status %d", w.Code)
	}
	if rightErr != nil || rightKey == "" || rightKey != reqKey {
		t.Errorf("echo5idem.DownstreamKey = %q, %v; want %q", rightKey, rightErr, reqKey)
	}
	_ = adaptertest.Do(ec, "POST", "/open", "k1")
	if outsideKey != "" || !errors.Is(outsideErr, core.ErrNoAttempt) {
		t.Errorf("echo5idem.DownstreamKey outside the middleware = %q, %v; want an ErrNoAttempt error", outsideKey, outsideErr)
	}
}
