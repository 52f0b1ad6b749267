package core_test

import (
	"bytes"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/memstore"
)

// TestProblemErrIsTheSentinel: the Problem a custom ErrorWriter gets
// carries, in Err, the sentinel behind it (errors.Is), never the internal
// error: an internal problem's Err is ErrInternal and holds no temporary
// path or OS error, which go to the log under the problem's record_id.
// (An atomic answer past the recording cap that cannot be spilled,
// because $TMPDIR is missing, is such a problem; t.Setenv: not parallel.)
func TestProblemErrIsTheSentinel(t *testing.T) {
	var logs bytes.Buffer // DEBUG: the attempt is logged as released, with its cause
	var mu sync.Mutex
	var problems []core.Problem
	writer := func(w http.ResponseWriter, r *http.Request, p *core.Problem) {
		mu.Lock()
		problems = append(problems, *p)
		mu.Unlock()
		core.WriteProblem(w, r, p)
	}
	e, err := core.New(memstore.New().Atomic(), core.WithSingleCaller(), core.WithMaxResponseBody(10),
		core.WithErrorWriter(writer), core.WithLogger(slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))))
	if err != nil {
		t.Fatal(err)
	}
	h := e.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, strings.Repeat("x", 100)) // past the cap: spilled
	}))
	missing := filepath.Join(t.TempDir(), "no-such-dir")
	t.Setenv("TMPDIR", missing)

	post := func(key, body string) *httptest.ResponseRecorder {
		r := httptest.NewRequest(http.MethodPost, "/exports", strings.NewReader(body))
		r.Header.Set("Content-Type", "application/json")
		if key != "" {
			r.Header.Set(core.HeaderKey, key)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	if w := post("k1", `{"export":"all"}`); w.Code != http.StatusInternalServerError {
		t.Fatalf("status %d, want the 500 of an answer that could not be spilled", w.Code)
	}
	post("", `{}`) // a missing key: 400, its sentinel

	if len(problems) != 2 {
		t.Fatalf("the error writer got %d problems, want 2", len(problems))
	}
	internal, missingKey := problems[0], problems[1]
	if !errors.Is(internal.Err, core.ErrInternal) {
		t.Errorf("internal problem: Err %v, want ErrInternal", internal.Err)
	}
	if internal.Err != core.ErrInternal {
		t.Errorf("internal problem: Err %q, want the sentinel itself, not a wrapping of the cause", internal.Err)
	}
	for _, secret := range []string{missing, "no such file", "spill"} {
		if strings.Contains(internal.Err.Error(), secret) || strings.Contains(internal.Detail, secret) {
			t.Errorf("internal problem carries %q to the error writer: Err %q, Detail %q", secret, internal.Err, internal.Detail)
		}
	}
	if !strings.Contains(logs.String(), missing) || internal.RecordID == "" || !strings.Contains(logs.String(), internal.RecordID) {
		t.Errorf("the log does not have the cause (%s) under record_id %q:\n%s", missing, internal.RecordID, logs.String())
	}
	if missingKey.Err != core.ErrMissingKey {
		t.Errorf("missing-key problem: Err %v, want ErrMissingKey", missingKey.Err)
	}
}
