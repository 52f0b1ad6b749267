package ginidem

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"

	"github.com/gin-gonic/gin"
)

// writer is the gin.ResponseWriter the handlers write to while the engine
// captures the response. Like Gin's own it holds the status until the first
// byte (or WriteHeaderNow); Flush, Hijack and Unwrap reach the engine's
// writer, which decides what a stream or a hijack means for the record.
type writer struct {
	w      http.ResponseWriter // the engine's capture writer
	ctx    context.Context     // the request's, for CloseNotify
	status int
	size   int // -1 until the header is written
}

var _ gin.ResponseWriter = (*writer)(nil)

func (w *writer) Header() http.Header { return w.w.Header() }

func (w *writer) WriteHeader(code int) {
	switch {
	case code >= 100 && code < 200: // informational: sent (or ignored) by the engine's writer now
		w.w.WriteHeader(code)
	case code > 0 && !w.Written():
		w.status = code
	}
}

func (w *writer) WriteHeaderNow() {
	if !w.Written() {
		w.size = 0
		w.w.WriteHeader(w.status)
	}
}

func (w *writer) Write(p []byte) (int, error) {
	w.WriteHeaderNow()
	n, err := w.w.Write(p)
	w.size += n
	return n, err
}

func (w *writer) WriteString(s string) (int, error) {
	w.WriteHeaderNow()
	n, err := io.WriteString(w.w, s)
	w.size += n
	return n, err
}

func (w *writer) Status() int   { return w.status }
func (w *writer) Size() int     { return w.size }
func (w *writer) Written() bool { return w.size != -1 }

// Flush sends the pending header and flushes through the engine's writer.
func (w *writer) Flush() {
	w.WriteHeaderNow()
	_ = http.NewResponseController(w.w).Flush()
}

// Hijack hands the connection over when the engine's writer allows it (not
// in atomic mode) and nothing of the body was written yet, as Gin does.
func (w *writer) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	if w.size > 0 {
		return nil, nil, errors.New("ginidem: response body already written")
	}
	conn, rw, err := http.NewResponseController(w.w).Hijack()
	if err == nil && w.size < 0 {
		w.size = 0 // the header must not be written after a hijack
	}
	return conn, rw, err
}

// CloseNotify fires when the request's context is done (the client went
// away, or the request ended).
func (w *writer) CloseNotify() <-chan bool {
	ch := make(chan bool, 1)
	context.AfterFunc(w.ctx, func() { ch <- true })
	return ch
}

// Pusher returns nil unless the engine's writer supports server push.
func (w *writer) Pusher() http.Pusher {
	p, _ := w.w.(http.Pusher)
	return p
}

// Unwrap returns the engine's writer (for http.ResponseController).
func (w *writer) Unwrap() http.ResponseWriter { return w.w }
