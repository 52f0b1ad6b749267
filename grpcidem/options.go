package grpcidem

import (
	"context"
	"fmt"
	"log/slog"
	"strings"

	"github.com/idemkit/idem/core"
)

// Option configures UnaryServerInterceptor.
type Option interface{ apply(*config) error }

type option func(*config) error

func (f option) apply(c *config) error { return f(c) }

type config struct {
	caller       func(ctx context.Context) (string, error)
	singleCaller bool
	skip         func(ctx context.Context, fullMethod string) bool
	routeOpts    []core.RouteOption
	methods      map[string][]core.RouteOption
	recorded     map[string]bool
	logger       *slog.Logger
}

// WithCaller sets the function that names the caller (an account, tenant or
// API credential), typically from a value an authentication interceptor
// stored in the context. An error or "" refuses the call with
// Unauthenticated. Either WithCaller or WithSingleCaller is required.
// (The engine's core.WithCaller works on HTTP requests; a service served
// over both can give both the same function over the context.)
func WithCaller(f func(ctx context.Context) (string, error)) Option {
	return option(func(c *config) error {
		if f == nil {
			return fmt.Errorf("%w: grpcidem.WithCaller(nil)", core.ErrConfig)
		}
		c.caller = f
		return nil
	})
}

// WithSingleCaller states that the service has a single caller, so every
// call shares one key space. Use it only for internal services with one
// client.
func WithSingleCaller() Option {
	return option(func(c *config) error { c.singleCaller = true; return nil })
}

// WithSkipper leaves the calls for which skip returns true unprotected
// (default: every unary call is protected, and needs a key unless
// core.KeyOptional applies to its method). Leave reads out this way, or
// list the methods to protect: func(_ context.Context, m string) bool {
// return !protected[m] }.
func WithSkipper(skip func(ctx context.Context, fullMethod string) bool) Option {
	return option(func(c *config) error { c.skip = skip; return nil })
}

// WithRouteOptions sets route options (core.Leased, core.Retention,
// core.WaitInFlight, core.KeyOptional, core.MaxAttempt, core.Scope) for
// every method. HTTP-only options (core.Fingerprint, core.Methods) have no
// effect.
func WithRouteOptions(opts ...core.RouteOption) Option {
	return option(func(c *config) error { c.routeOpts = append(c.routeOpts, opts...); return nil })
}

// WithMethod sets route options for one method, by its full name
// ("/pkg.Service/Method"), after those of WithRouteOptions.
func WithMethod(fullMethod string, opts ...core.RouteOption) Option {
	return option(func(c *config) error {
		if !strings.HasPrefix(fullMethod, "/") || strings.Count(fullMethod, "/") != 2 {
			return fmt.Errorf("%w: grpcidem.WithMethod(%q): give the full method name, \"/pkg.Service/Method\"", core.ErrConfig, fullMethod)
		}
		c.methods[fullMethod] = append(c.methods[fullMethod], opts...)
		return nil
	})
}

// neverRecorded are metadata keys never recorded, even when listed:
// credentials, the transport's own and the replay marker.
var neverRecorded = map[string]bool{
	"authorization": true, "proxy-authorization": true, "cookie": true, "set-cookie": true,
	"content-type": true, "te": true, "user-agent": true, "connection": true, "keep-alive": true,
	"transfer-encoding": true, "upgrade": true, "trailer": true, MetadataReplayed: true,
}

// WithRecordedMetadata sets the header and trailer metadata keys that are
// recorded and replayed (default: none; the first call gets every key the
// handler set). Credentials, the transport's own keys (content-type, te,
// grpc-*) and hop-by-hop keys are never recorded, even when listed.
func WithRecordedMetadata(keys ...string) Option {
	return option(func(c *config) error {
		c.recorded = map[string]bool{}
		for _, k := range keys {
			k = strings.ToLower(k)
			if !neverRecorded[k] && !strings.HasPrefix(k, "grpc-") && !strings.HasPrefix(k, ":") {
				c.recorded[k] = true
			}
		}
		return nil
	})
}

// WithLogger sets the logger of the interceptor's own errors (a response
// that cannot be recorded or replayed; default slog.Default()). The
// engine's decisions go to the engine's logger.
func WithLogger(l *slog.Logger) Option {
	return option(func(c *config) error {
		if l == nil {
			return fmt.Errorf("%w: grpcidem.WithLogger(nil)", core.ErrConfig)
		}
		c.logger = l
		return nil
	})
}
