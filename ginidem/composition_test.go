package ginidem_test

import (
	"bytes"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/gin-gonic/gin"
	"github.com/gin-gonic/gin/binding"
	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/ginidem"
	"github.com/idemkit/idem/internal/adaptertest"
)

// TestConfigWithoutEngine: a Config without an engine is a configuration
// error, not a panic at the first request.
func TestConfigWithoutEngine(t *testing.T) {
	if _, err := (ginidem.Config{}).ToMiddleware(); !errors.Is(err, core.ErrConfig) {
		t.Errorf("ToMiddleware without an engine: %v, want core.ErrConfig", err)
	}
}

type order struct {
	Amount int `json:"amount"`
}

func post(h http.Handler, body, key string) *httptest.ResponseRecorder {
	req := httptest.NewRequest("POST", "/orders", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(core.HeaderKey, key)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, req)
	return w
}

// TestBodyBoundUpstream: a middleware before idem that binds the body
// with c.ShouldBindBodyWith leaves the bytes in gin.BodyBytesKey; they are
// fingerprinted, so another body under the same key is a 422.
func TestBodyBoundUpstream(t *testing.T) {
	e, _ := adaptertest.NewEngine(t, nil)
	r := gin.New()
	r.Use(func(c *gin.Context) {
		var o order
		if err := c.ShouldBindBodyWith(&o, binding.JSON); err != nil {
			c.AbortWithStatus(http.StatusBadRequest)
			return
		}
		c.Next()
	})
	r.Use(ginidem.New(e))
	runs := 0
	r.POST("/orders", func(c *gin.Context) {
		runs++
		var o order
		if err := c.ShouldBindBodyWith(&o, binding.JSON); err != nil {
			c.Status(http.StatusBadRequest)
			return
		}
		c.JSON(http.StatusCreated, gin.H{"amount": o.Amount})
	})

	first := post(r, `{"amount":10}`, "k1")
	if first.Code != http.StatusCreated || first.Body.String() != `{"amount":10}` {
		t.Fatalf("first: %d %q", first.Code, first.Body)
	}
	if w := post(r, `{"amount":10}`, "k1"); !adaptertest.Replayed(w) || !bytes.Equal(w.Body.Bytes(), first.Body.Bytes()) {
		t.Errorf("same body: %d %q, want the replay", w.Code, w.Body)
	}
	if w := post(r, `{"amount":99}`, "k1"); w.Code != http.StatusUnprocessableEntity {
		t.Errorf("another body under the same key: %d %q, want 422 (the body must be fingerprinted)", w.Code, w.Body)
	}
	if runs != 1 {
		t.Errorf("the handler ran %d times, want 1", runs)
	}
}
