package echoidem_test

import (
	"errors"
	"net/http"
	"testing"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/echoidem"
	"github.com/idemkit/idem/internal/adaptertest"
	"github.com/labstack/echo/v4"
)

// TestDownstreamKeyFromTheEchoContext: echoidem.DownstreamKey(c, ...) gives
// the request's key; without a protected request it fails with
// core.ErrNoAttempt instead of returning "".
func TestDownstreamKeyFromTheEchoContext(t *testing.T) {
	e, _ := adaptertest.NewEngine(t, nil)
	var rightKey, reqKey, outsideKey string
	var rightErr, outsideErr error
	ec := echo.New()
	ec.POST("/pay", func(c echo.Context) error {
		rightKey, rightErr = echoidem.DownstreamKey(c, "charge")
		reqKey, _ = core.DownstreamKey(c.Request().Context(), "charge")
		return c.NoContent(http.StatusCreated)
	}, echoidem.New(e))
	ec.POST("/open", func(c echo.Context) error {
		outsideKey, outsideErr = echoidem.DownstreamKey(c, "charge")
		return c.NoContent(http.StatusCreated)
	})
	if w := adaptertest.Do(ec, "POST", "/pay", "k1"); w.Code != http.StatusCreated {
		t.Fatalf("status %d", w.Code)
	}
	if rightErr != nil || rightKey == "" || rightKey != reqKey {
		t.Errorf("echoidem.DownstreamKey = %q, %v; want %q", rightKey, rightErr, reqKey)
	}
	_ = adaptertest.Do(ec, "POST", "/open", "k1")
	if outsideKey != "" || !errors.Is(outsideErr, core.ErrNoAttempt) {
		t.Errorf("echoidem.DownstreamKey outside the middleware = %q, %v; want an ErrNoAttempt error", outsideKey, outsideErr)
	}
}
