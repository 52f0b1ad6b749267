package ginidem_test

import (
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

// TestWithinGinHandler: ginidem.Within runs a Gin handler as Gin does,
// inside the service's transaction: it binds with c.ShouldBindJSON,
// answers with c.JSON (or c.AbortWithStatusJSON), and finds the
// transaction and the attempt in c.Request.Context(); both answers are
// recorded and replayed.
func TestWithinGinHandler(t *testing.T) {
	e, err := core.New(memstore.New().Atomic(), core.WithSingleCaller())
	if err != nil {
		t.Fatal(err)
	}
	inTx, route := scenario.StoreTx(e), e.Route()
	runs := 0
	create := func(c *gin.Context) {
		runs++
		info, ok := core.AttemptFrom(c.Request.Context())
		if !ok || !info.Atomic || !e.Store().(core.TxStore).InTx(c.Request.Context()) {
			c.AbortWithStatus(http.StatusInternalServerError)
			return
		}
		var in struct{ Item string }
		if err := c.ShouldBindJSON(&in); err != nil || in.Item == "" {
			c.AbortWithStatusJSON(http.StatusConflict, gin.H{"error": "out of stock"})
			return
		}
		c.JSON(http.StatusCreated, gin.H{"item": in.Item})
	}
	r := gin.New()
	r.POST("/orders", func(c *gin.Context) { ginidem.Within(c, route, inTx, create) })

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
		{"k2", `{}`, `{"error":"out of stock"}`, http.StatusConflict},
	} {
		first, again := do(tt.key, tt.body), do(tt.key, tt.body)
		if first.Code != tt.status || first.Body.String() != tt.want || adaptertest.Replayed(first) {
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
