package ginidem_test

import (
	"bytes"
	"errors"
	"io"
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

// TestSkipper: a global install with a Skipper leaves the skipped route
// unprotected and protects the others.
func TestSkipper(t *testing.T) {
	e, _ := adaptertest.NewEngine(t, nil)
	r := gin.New()
	r.Use(ginidem.NewWithConfig(ginidem.Config{Engine: e, Skipper: func(c *gin.Context) bool {
		return c.FullPath() == "/webhooks/:provider"
	}}))
	var orders, hooks int
	r.POST("/orders", counter(&orders))
	r.POST("/webhooks/:provider", counter(&hooks))

	for i := 1; i <= 2; i++ {
		if w := adaptertest.Do(r, "POST", "/webhooks/stripe", ""); w.Code != http.StatusCreated || adaptertest.Replayed(w) {
			t.Fatalf("skipped route, run %d: %d %q, want the handler's 201", i, w.Code, w.Body)
		}
	}
	if hooks != 2 {
		t.Errorf("the skipped route ran %d times, want 2", hooks)
	}
	if w := adaptertest.Do(r, "POST", "/orders", ""); w.Code != http.StatusBadRequest {
		t.Errorf("protected route without a key: %d, want 400", w.Code)
	}
	adaptertest.Do(r, "POST", "/orders", "k1")
	if w := adaptertest.Do(r, "POST", "/orders", "k1"); !adaptertest.Replayed(w) || orders != 1 {
		t.Errorf("protected route: duplicate not replayed (%d runs)", orders)
	}
}

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

// TestBodyConsumedUpstream: a middleware before idem that reads the body
// without leaving it makes idem refuse the request (500, body-consumed),
// never fingerprint it as empty.
func TestBodyConsumedUpstream(t *testing.T) {
	e, _ := adaptertest.NewEngine(t, nil)
	r := gin.New()
	r.Use(func(c *gin.Context) {
		_, _ = io.ReadAll(c.Request.Body)
		c.Next()
	})
	r.Use(ginidem.New(e))
	runs := 0
	r.POST("/orders", counter(&runs))

	w := post(r, `{"amount":10}`, "k1")
	if w.Code != http.StatusInternalServerError || !strings.Contains(w.Body.String(), "body-consumed") {
		t.Errorf("consumed body: %d %q, want a 500 body-consumed problem", w.Code, w.Body)
	}
	if runs != 0 {
		t.Errorf("the handler ran %d times, want 0", runs)
	}
}
