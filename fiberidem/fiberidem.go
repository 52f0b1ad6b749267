package fiberidem

import (
	"fmt"
	"net/http"
	"reflect"

	"github.com/gofiber/fiber/v3"
	"github.com/idemkit/idem/core"
)

// Config configures the middleware.
type Config struct {
	// Engine is the idempotency engine. Required.
	Engine *core.Engine
	// Next selects requests that pass through unprotected, as in Fiber's
	// own middleware configs (default: nil, none). Installed with Use it
	// runs before Fiber routes the request: it sees the path, not the route.
	Next func(c fiber.Ctx) bool
	// Options are the route options over the engine's defaults (default: none).
	Options []core.RouteOption
}

// New returns Fiber middleware that protects the requests it sees with e
// and the route options opts, installed for the whole app (app.Use), on a
// group or on one route (see the package documentation). It panics with an
// error wrapping core.ErrConfig when e is nil.
func New(e *core.Engine, opts ...core.RouteOption) fiber.Handler {
	return NewWithConfig(Config{Engine: e, Options: opts})
}

// NewWithConfig is New with a Config; it panics with an error wrapping
// core.ErrConfig on an invalid configuration (see Config.ToMiddleware for
// the error instead).
func NewWithConfig(config Config) fiber.Handler {
	mw, err := config.ToMiddleware()
	if err != nil {
		panic(err)
	}
	return mw
}

// ToMiddleware returns the middleware, or an error wrapping core.ErrConfig
// when the configuration is invalid.
func (config Config) ToMiddleware() (fiber.Handler, error) {
	if config.Engine == nil {
		return nil, fmt.Errorf("%w: fiberidem: Config.Engine is nil", core.ErrConfig)
	}
	skip := config.Next
	rt, keyHeader := config.Engine.Route(config.Options...), config.Engine.KeyHeader()
	mw := func(c fiber.Ctx) error {
		if skip != nil && skip(c) {
			return c.Next()
		}
		if !protects(rt, keyHeader, c) && !nested(c) {
			return c.Next()
		}
		pattern, routed, later := routeOf(c)
		switch {
		case !routed && later == "":
			return c.Next() // Fiber answers 404 or 405 itself
		case !routed:
			// Not on a route yet, and a later middleware may still move
			// it onto one (the rewrite middleware, c.Path(...)): fail closed.
			x := newExchange(c)
			rt.Refuse(x.writer(), x.request(), fmt.Errorf("%w: fiberidem: %s %s matches no route after fiberidem, but middleware registered later (Use %q) runs for it first and may rewrite it onto one; "+
				"install fiberidem after the path-rewriting middleware (the rewrite middleware, c.Path), or on the routes",
				core.ErrNotProtected, c.Method(), c.Path(), later))
			return nil
		}
		x := newExchange(c)
		var err error
		rt.Serve(x.writer(), x.request(), pattern, c, func(w http.ResponseWriter, r *http.Request) {
			err = x.run(w, r, c.Next)
		})
		return err
	}
	layerCode.Store(reflect.ValueOf(mw).Pointer())
	return mw, nil
}

// Within serves c's request for a service that owns its transaction, as
// core.Route.Within does (rt an atomic route: a TxStore, not Leased), with
// a Fiber handler: it runs with c, whose Context() carries the
// transaction and the attempt (sqlstore.Tx(c.Context()), core.MarkEffect)
// and whose response is captured; an error it returns goes through the
// app's ErrorHandler inside the capture, as under the middleware. Caller
// finds c, and the decisions are labelled with c.FullPath(). The client
// gets the answer after inTx returned (the commit); Within returns nil:
//
//	route := eng.Route()
//	app.Post("/payments", func(c fiber.Ctx) error {
//		return fiberidem.Within(c, route, svc.InTx, createPayment)
//	})
func Within(c fiber.Ctx, rt *core.Route, inTx core.TxFunc, handler fiber.Handler) error {
	x := newExchange(c)
	var h http.HandlerFunc
	if handler != nil {
		h = func(w http.ResponseWriter, r *http.Request) {
			_ = x.run(w, r, func() error { return handler(c) })
		}
	}
	rt.ServeWithin(x.writer(), x.request(), c.FullPath(), c, inTx, h)
	return nil
}

// Caller adapts a function reading the caller from the Fiber context
// (typically a value an authentication middleware stored with c.Locals)
// to a caller function for core.WithCaller:
//
//	core.WithCaller(fiberidem.Caller(func(c fiber.Ctx) (string, error) {
//		account, _ := c.Locals("account").(string)
//		return account, nil
//	}))
//
// The string it returns outlives the request (it is part of the record's
// identity): return a copy, never a string that aliases Fiber's buffers
// (c.Get and c.Params do unless the app is Immutable; strings.Clone).
// It needs the Fiber context, which the fiberidem middleware and Within
// pass to the engine. Anywhere else it fails with an error wrapping
// core.ErrNotProtected that names the fix: the request is refused with a
// 500 not-protected problem (a wiring fault of the server, not the
// client's: never a 401), logged at WARN.
func Caller(f func(fiber.Ctx) (string, error)) func(*http.Request) (string, error) {
	return func(r *http.Request) (string, error) {
		c, ok := core.NativeFrom(r.Context()).(fiber.Ctx)
		if !ok {
			return "", errNoContext
		}
		return f(c)
	}
}

var errNoContext = fmt.Errorf("%w: fiberidem.Caller found no Fiber context: the request is served neither by a fiberidem middleware nor by fiberidem.Within "+
	"(core.Route.Within called by hand? return fiberidem.Within(c, route, inTx, handler) instead)", core.ErrNotProtected)

// DownstreamKey is core.DownstreamKey for a Fiber handler: the
// deterministic key of step (such as "charge") of the protected request c
// runs, to pass to an external API. It reads c.Context(), which carries
// the attempt (a fiber.Ctx is a context.Context too, but not that one:
// core.DownstreamKey(c, step) fails). Outside a protected request it
// returns an error wrapping core.ErrNoAttempt, never an empty key.
func DownstreamKey(c fiber.Ctx, step string) (string, error) {
	return core.DownstreamKey(c.Context(), step)
}

// nested reports whether c runs inside a request another layer protects
// (a global install around this one): such a request goes to the engine
// even when this layer's options would pass it through, so the engine
// takes it over or refuses the pair.
func nested(c fiber.Ctx) bool {
	_, ok := core.AttemptFrom(c.Context())
	return ok
}
