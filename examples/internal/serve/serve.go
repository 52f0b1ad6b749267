// Package serve runs the examples' HTTP servers (examples/orders,
// examples/otel) until they are told to stop.
package serve

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"
)

// Run serves h on addr until ctx ends, then shuts the server down,
// letting the requests in flight finish (15 s at the most). It logs
// "NAME: listening" with the address it bound (addr 127.0.0.1:0 picks a
// free port) and attrs; the end-to-end tests read that line.
func Run(ctx context.Context, logger *slog.Logger, name, addr string, h http.Handler, attrs ...any) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	logger.Info(name+": listening", append([]any{"addr", ln.Addr().String()}, attrs...)...)
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	logger.Info(name + ": shutting down")
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		return fmt.Errorf("shutdown: %w", err)
	}
	if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
