package core_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/memstore"
)

// In atomic mode an answer past the recording cap spills to a temporary
// file in $TMPDIR. When that file cannot be created, the handler's write
// fails, nothing is recorded (the attempt is released), the client gets
// the engine's 500 and none of the body, and the retry runs. When it can,
// the client gets the whole answer and the file is gone once the request
// ended. (t.Setenv: not in the parallel scenario suite.)
func TestAtomicSpillFile(t *testing.T) {
	const limit = 100
	chunk := strings.Repeat("x", 64)
	e, err := core.New(memstore.New().Atomic(), quiet, core.WithSingleCaller(), core.WithMaxResponseBody(limit))
	if err != nil {
		t.Fatal(err)
	}
	runs := 0
	var writeErr error
	srv := httptest.NewServer(e.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs++
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.WriteHeader(http.StatusCreated)
		writeErr = nil
		for range 4 {
			if _, err := io.WriteString(w, chunk); err != nil {
				writeErr = err
				return
			}
		}
	})))
	t.Cleanup(srv.Close)
	post := func() (int, string) {
		t.Helper()
		req, err := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader(`{"export":"all"}`))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set(core.HeaderKey, "k1")
		res, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, err := io.ReadAll(res.Body)
		if err != nil {
			t.Fatal(err)
		}
		return res.StatusCode, string(b)
	}

	tmp := t.TempDir()
	t.Setenv("TMPDIR", filepath.Join(tmp, "missing"))
	status, body := post()
	if status != http.StatusInternalServerError || strings.Contains(body, chunk) {
		t.Errorf("with no temporary directory the client got %d %q, want the 500 problem and none of the body", status, body)
	}
	if writeErr == nil {
		t.Error("the handler's write past the cap succeeded although the temporary file could not be created")
	}

	t.Setenv("TMPDIR", tmp)
	status, body = post()
	if status != http.StatusCreated || body != strings.Repeat(chunk, 4) {
		t.Errorf("the retry got %d %q, want 201 with the whole answer", status, body)
	}
	if writeErr != nil {
		t.Errorf("the handler's write failed: %v", writeErr)
	}
	if runs != 2 {
		t.Errorf("the handler ran %d times, want 2 (nothing recorded by the failed attempt)", runs)
	}
	if left, err := os.ReadDir(tmp); err != nil || len(left) != 0 {
		t.Errorf("the temporary directory holds %v (%v) after the request, want nothing", left, err)
	}
}
