package ginidem_test

import (
	"errors"
	"net/http"
	"testing"

	"github.com/gin-gonic/gin"
	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/ginidem"
	"github.com/idemkit/idem/internal/adaptertest"
)

// TestDownstreamKeyFromTheGinContext: core.DownstreamKey(c, ...) with the
// *gin.Context fails with core.ErrNoAttempt instead of returning "";
// ginidem.DownstreamKey(c, ...) gives the request's key.
func TestDownstreamKeyFromTheGinContext(t *testing.T) {
	e, _ := adaptertest.NewEngine(t, nil)
	var wrongKey, rightKey, reqKey string
	var wrongErr, rightErr error
	r := gin.New()
	r.POST("/pay", ginidem.New(e), func(c *gin.Context) {
		wrongKey, wrongErr = core.DownstreamKey(c, "charge")
		rightKey, rightErr = ginidem.DownstreamKey(c, "charge")
		reqKey, _ = core.DownstreamKey(c.Request.Context(), "charge")
		c.Status(http.StatusCreated)
	})
	if w := adaptertest.Do(r, "POST", "/pay", "k1"); w.Code != http.StatusCreated {
		t.Fatalf("status %d", w.Code)
	}
	if wrongKey != "" || !errors.Is(wrongErr, core.ErrNoAttempt) {
		t.Errorf("core.DownstreamKey(*gin.Context) = %q, %v; want an ErrNoAttempt error", wrongKey, wrongErr)
	}
	if rightErr != nil || rightKey == "" || rightKey != reqKey {
		t.Errorf("ginidem.DownstreamKey = %q, %v; want %q", rightKey, rightErr, reqKey)
	}
}
