package main

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// TestRunWithUnknownOTel: an -otel value that is none of off, stdout and
// prometheus stops the start with a message naming them.
func TestRunWithUnknownOTel(t *testing.T) {
	err := run("127.0.0.1:0", "jaeger", time.Second, slog.New(slog.NewTextHandler(&bytes.Buffer{}, nil)))
	if err == nil || !strings.Contains(err.Error(), `-otel "jaeger": want off, stdout or prometheus`) {
		t.Fatalf("run with -otel jaeger: %v, want the error naming off, stdout and prometheus", err)
	}
}
