// Package scenario is the HTTP scenario suite of idem: every adapter (Gin,
// Echo, chi) and plain net/http run it, so a client of any of them observes
// exactly the behaviour of docs/contract.md, sections 3 "What a client
// observes" and 4 "Outcomes".
//
// An adapter's tests call [Run] with a [Factory] that builds a router
// serving the suite's routes through the adapter's per-route middleware:
//
//	func TestScenarios(t *testing.T) {
//		scenario.Run(t, func(t *testing.T, e *core.Engine, routes []scenario.Route) http.Handler {
//			r := chi.NewRouter()
//			for _, rt := range routes {
//				r.With(chiidem.New(e, rt.Options...)).MethodFunc(rt.Method, rt.Pattern, rt.Handler)
//			}
//			return r
//		})
//	}
//
// and, for a middleware installed once for the whole router (r.Use), with
// a [GlobalFactory] for [RunGlobal] (which also checks that the router's
// own 404 and 405 pass untouched), and, for the middleware installed both
// for the whole router and again on each route (one protection, the
// route's options), with a [NestedFactory] for [RunNested]. [RunWithin]
// runs the HTTP path of a service that owns its transaction
// (core.Route.Within, atomic mode): its [Factory] serves each route with
// route.Within(w, r, inTx, rt.Handler) or the adapter's own Within, inTx
// a transaction the service opens ([StoreTx] over the engine's store).
// [RunRecovered] runs a global install behind the framework's own
// recovery middleware ([RecoveredFactory]): a panic is answered inside the
// router and the record is released (or left indeterminate after an
// effect). [RunAcross] sends one key through two routers (two [Factory] values:
// two adapters, or one with a route parameter renamed) on one store, as
// the replicas of a service in a rolling migration would: they share
// every record.
//
// # What a factory must do
//
//   - Register every route with its method and pattern. Patterns use
//     ServeMux and chi syntax ("/orders/{id}/refunds"); translate them for
//     routers that spell parameters differently (":id" for Gin and Echo).
//   - Protect every route with the adapter's middleware for the given engine
//     and the route's Options (a [Factory]: per route), or once for the
//     whole router with no options (a [GlobalFactory]), or both: once for
//     the whole router with no options and on each route with its Options
//     (a [NestedFactory]). The middleware passes the router's route
//     pattern to the engine as a label (observe.Event.Route), never the
//     concrete path; the identity never depends on it (the scope is empty
//     unless a route names one with core.Scope).
//   - Call the route's Handler with the writer and the request the
//     middleware passes on: the request carries the engine's context
//     (core.AttemptFrom, core.MarkEffect, core.Release, the transaction),
//     and the handler reads the request body, which the middleware has
//     already read to fingerprint it. The middleware must see the URL as
//     the client sent it: the default fingerprint covers the method, the
//     concrete path and the query besides the body.
//   - Install no recovery middleware and nothing else that writes
//     responses (but a [RecoveredFactory], which installs the framework's
//     own recovery): a panic in a handler must propagate out of
//     ServeHTTP. The suite wraps the router in its own recovery and checks
//     that the panic reaches it.
//   - A [GlobalFactory] leaves the routes marked [Route].Skip out of its
//     install with the adapter's skipper (Config.Skipper, Fiber's Next).
//
// # How the suite runs
//
// Every scenario runs as a subtest of its mode ("leased" or "atomic") named
// in CamelCase after the behaviour it checks ("ReplaysRecordedAnswer",
// "BodyMismatch"), as core/storetest's cases are, so that -run selects it
// (go test -run 'TestScenarios/atomic/BodyMismatch'), and carries one
// sentence stating the rule, printed when it fails. Scenarios run in leased mode (memstore.New()) and, where the
// rule applies, in atomic mode (memstore.New().Atomic()), each with its own
// store and engine, one after another (never in parallel). The factory is
// called once per scenario.
//
// Each engine identifies the caller by the X-Caller request header (absent
// or empty: 401) and reads time from a clock the suite controls: leases and
// retention windows pass by moving that clock, never by sleeping. In-flight
// scenarios hold the first handler open on a channel. Wall-clock time is
// used only for failsafe timeouts, so a router that blocks fails a scenario
// instead of hanging the run; they are not latency assertions.
//
// Most scenarios call the router directly with an httptest.ResponseRecorder;
// the concurrency and Hijack scenarios serve it on an httptest.Server (real
// TCP, real concurrency).
//
// Every rejection is checked as an RFC 9457 problem document: status,
// Content-Type application/problem+json, Cache-Control no-store, and a JSON
// body whose type is the problem base (core.DefaultProblemBase unless the
// scenario sets WithProblemBase) followed by the stable slug of the error,
// with a title, the status and a detail.
//
// The package depends on the standard library and core only.
package scenario
