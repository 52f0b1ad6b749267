package scenario

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
)

// logRecorder is the engine's slog handler in the suite: it keeps every
// record (level and text) for the scenarios that check logging, and passes
// it on to the test log.
type logRecorder struct {
	next  slog.Handler
	attrs []slog.Attr
	lines *logLines
}

type logLines struct {
	mu    sync.Mutex
	lines []logLine
}

// logLine is one log record: its level and its message with every
// attribute, as key=value.
type logLine struct {
	Level slog.Level
	Text  string
}

func newLogRecorder(next slog.Handler) *logRecorder {
	return &logRecorder{next: next, lines: &logLines{}}
}

func (h *logRecorder) Enabled(context.Context, slog.Level) bool { return true }

func (h *logRecorder) Handle(ctx context.Context, r slog.Record) error {
	var b strings.Builder
	b.WriteString(r.Message)
	write := func(a slog.Attr) bool {
		fmt.Fprintf(&b, " %s=%v", a.Key, a.Value)
		return true
	}
	for _, a := range h.attrs {
		write(a)
	}
	r.Attrs(write)
	h.lines.mu.Lock()
	h.lines.lines = append(h.lines.lines, logLine{Level: r.Level, Text: b.String()})
	h.lines.mu.Unlock()
	return h.next.Handle(ctx, r)
}

func (h *logRecorder) WithAttrs(attrs []slog.Attr) slog.Handler {
	return &logRecorder{next: h.next.WithAttrs(attrs), attrs: append(append([]slog.Attr(nil), h.attrs...), attrs...), lines: h.lines}
}

func (h *logRecorder) WithGroup(name string) slog.Handler {
	return &logRecorder{next: h.next.WithGroup(name), attrs: h.attrs, lines: h.lines}
}

// logs returns the records logged so far.
func (x *harness) logs() []logLine {
	x.logRec.lines.mu.Lock()
	defer x.logRec.lines.mu.Unlock()
	return append([]logLine(nil), x.logRec.lines.lines...)
}
