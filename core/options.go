package core

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/idemkit/idem/core/observe"
	"github.com/idemkit/idem/core/seal"
	"github.com/idemkit/idem/core/store"
)

// The engine's headers, its limit on keys, and the defaults of its
// options, of the Completer and the Sweeper fields, and of
// Engine.Records.
const (
	// HeaderKey is the request header that carries the idempotency key
	// (unless WithKeyHeader names another); HeaderReplayed is the
	// response header that marks a replay.
	HeaderKey      = "Idempotency-Key"
	HeaderReplayed = "Idempotent-Replayed"
	// MaxKeyLen is the longest accepted key, in bytes, after trimming.
	MaxKeyLen = 255

	DefaultRetention       = 24 * time.Hour   // how long a record lives
	DefaultLease           = 30 * time.Second // leased mode: lease of a running attempt
	DefaultMaxAttempt      = 5 * time.Minute  // how long one attempt may run (MaxAttempt)
	DefaultRetryAfter      = 1 * time.Second  // Retry-After of 409 and 503 answers
	DefaultMaxRequestBody  = 1 << 20          // bytes read to fingerprint a request
	DefaultMaxResponseBody = 1 << 20          // bytes of a response body that are recorded
	DefaultProblemBase     = "https://github.com/idemkit/idem/blob/main/docs/problems.md#"
	// DefaultProblemDocs is the documentation the engine's problem
	// documents link to (WithProblemDocs): idem's page of problem types,
	// which says what each one means and what a client does about it.
	DefaultProblemDocs = "https://github.com/idemkit/idem/blob/main/docs/problems.md"

	DefaultCompleteEvery = 10 * time.Second // Completer.Every
	DefaultCompleteBatch = 100              // Completer.Batch
	DefaultMaxTries      = 10               // Completer.MaxTries
	DefaultBackoff       = 30 * time.Second // Completer.Backoff
	DefaultMaxBackoff    = time.Hour        // Completer.MaxBackoff
	DefaultSweepEvery    = time.Minute      // Sweeper.Every
	DefaultSweepBatch    = 1000             // Sweeper.Batch
	DefaultRecordsLimit  = 100              // the page size of Engine.Records when the query gives none
)

var (
	// DefaultRecordedHeaders are the response headers recorded and
	// replayed unless WithRecordedHeaders says otherwise.
	DefaultRecordedHeaders = []string{"Content-Type", "Content-Encoding", "Content-Language", "Location", "ETag"}
	// ExposedHeaders are the response headers the engine sets that a
	// browser client must be allowed to read across origins (they are not
	// CORS-safelisted): Idempotent-Replayed on a replay, Retry-After on a
	// 409 or 503, and the Link of a problem document. List them in
	// Access-Control-Expose-Headers, and the key header (HeaderKey, or
	// WithKeyHeader's) in Access-Control-Allow-Headers; see the README's
	// CORS example. Treat it as read-only.
	ExposedHeaders = []string{HeaderReplayed, "Retry-After", "Link"}
)

// neverRecorded are response headers that are never recorded, even when
// allowlisted: credentials and hop-by-hop fields.
var neverRecorded = map[string]bool{
	"Set-Cookie": true, "Set-Cookie2": true, "Authorization": true, "Proxy-Authorization": true,
	"Proxy-Authenticate": true, "Connection": true, "Keep-Alive": true, "Te": true,
	"Trailer": true, "Transfer-Encoding": true, "Upgrade": true, "Content-Length": true,
	"Idempotent-Replayed": true,
}

// Option configures an Engine.
type Option interface{ applyEngine(*config) error }

// RouteOption configures one protected route (or one Once call site). Route
// options also work as engine options, where they set the default for every
// route.
type RouteOption interface {
	Option
	applyRoute(*policy)
}

type engineOption func(*config) error

func (f engineOption) applyEngine(c *config) error { return f(c) }

type routeOption func(*policy)

func (f routeOption) applyEngine(c *config) error { f(&c.policy); return nil }
func (f routeOption) applyRoute(p *policy)        { f(p) }

// config is the engine-wide configuration.
type config struct {
	policy       policy
	caller       func(r *http.Request) (string, error)
	singleCaller bool
	clock        func() time.Time
	lease        time.Duration
	takeover     bool
	retryAfter   time.Duration
	maxRequest   int64
	maxResponse  int64
	recorded     []string
	sealer       seal.Sealer
	failOpen     bool
	problemBase  string
	errorWriter  func(w http.ResponseWriter, r *http.Request, p *Problem)
	observer     observe.Observer
	logger       *slog.Logger
	logRawKeys   bool
	keyHeader    string  // WithKeyHeader; "": HeaderKey
	problemDocs  *string // WithProblemDocs; nil: DefaultProblemDocs
}

// policy is what a route may override.
type policy struct {
	scope       string // explicit scope name; "" by default
	retention   time.Duration
	wait        time.Duration // 0 = reject in-flight duplicates at once
	leased      bool          // force leased mode on a TxStore
	atomic      bool          // require atomic mode (Atomic)
	fingerprint Fingerprinter // nil: DefaultFingerprint
	optionalKey bool
	methods     []string
	maxAttempt  time.Duration                                             // 0: unbounded
	resolver    *Resolver                                                 // nil: indeterminate records stay so
	name        string                                                    // Name: the route's name for the Completer; "" unnamed
	record      *func(body []byte) ([]byte, error)                        // RecordRequest; nil: the request is not recorded
	finish      *func(ctx context.Context, req RecordedRequest) *Response // Finish; nil: "not applied" releases the key
}

// WithCaller sets the function that names the caller: who is asking (an
// account, tenant or API credential), typically read from a value an
// earlier authentication middleware stored. An error or an empty string
// answers 401 (ErrNoCaller). Adapters offer framework-typed variants
// (ginidem.Caller, echoidem.Caller) built on NativeFrom. Either WithCaller
// or WithSingleCaller is required: a deployment must not share one key
// space between callers by accident.
func WithCaller(f func(r *http.Request) (string, error)) Option {
	return engineOption(func(c *config) error {
		if f == nil {
			return fmt.Errorf("%w: WithCaller(nil)", ErrConfig)
		}
		c.caller = f
		return nil
	})
}

// WithSingleCaller states that the API has a single caller, so every request
// shares one key space. Use it only for internal APIs with one client.
func WithSingleCaller() Option {
	return engineOption(func(c *config) error { c.singleCaller = true; return nil })
}

// WithClock sets the clock used for leases and expiry (default time.Now).
// Processes that share a store should use the same time source; the SQL
// stores offer a clock that follows the database's.
func WithClock(now func() time.Time) Option {
	return engineOption(func(c *config) error {
		if now == nil {
			return fmt.Errorf("%w: WithClock(nil)", ErrConfig)
		}
		c.clock = now
		return nil
	})
}

// WithLease sets the lease of a running attempt in leased mode (default
// DefaultLease). The attempt extends it every third of its length while it
// runs; an attempt that stops extending (crash, long pause) is taken over
// once the lease lapses. Meanwhile duplicates get 409 with Retry-After: the
// default (WithRetryAfter) while the lease could be a live holder's, then,
// once less than half of it is left, the time until it lapses. Give every
// replica the same lease, and clients a retry budget longer than it
// (idemclient's default, one minute, outlasts the default lease).
func WithLease(d time.Duration) Option {
	return engineOption(func(c *config) error {
		if d < 10*time.Millisecond {
			return fmt.Errorf("%w: lease %v is shorter than 10ms", ErrConfig, d)
		}
		c.lease = d
		return nil
	})
}

// WithoutTakeover changes what happens to an in-progress record whose
// lease lapsed (leased mode): by default the next request takes it over
// with a new fencing token; with WithoutTakeover the record turns
// indeterminate instead, settled by the Resolver or answered with 500.
func WithoutTakeover() Option {
	return engineOption(func(c *config) error { c.takeover = false; return nil })
}

// WithRetryAfter sets the Retry-After of 409 (in progress) and 503 (store
// unavailable) answers (default DefaultRetryAfter). One exception: a 409
// for a leased record whose lease is no longer being extended (less than
// half of it left: a live holder's heartbeat keeps more) says when that
// lease lapses, rounded up to whole seconds, so that a retry comes back
// when it can take the record over instead of polling meanwhile.
func WithRetryAfter(d time.Duration) Option {
	return engineOption(func(c *config) error {
		if d < 0 {
			return fmt.Errorf("%w: negative Retry-After", ErrConfig)
		}
		c.retryAfter = d
		return nil
	})
}

// WithMaxRequestBody sets how many bytes of a request body are read to
// fingerprint it (default DefaultMaxRequestBody). A larger body is refused
// with 413 (ErrBodyTooLarge), before the handler runs. The memory a body
// holds grows with the bytes received (about twice them at most), never
// with its declared Content-Length.
func WithMaxRequestBody(n int64) Option {
	return engineOption(func(c *config) error {
		if n < 0 {
			return fmt.Errorf("%w: negative request body limit", ErrConfig)
		}
		c.maxRequest = n
		return nil
	})
}

// WithMaxResponseBody sets how many bytes of a response body are recorded
// (default DefaultMaxResponseBody). A larger response is still delivered to
// the first client; its record says the body was not kept. It also bounds
// what a request holds in memory: past it, a leased attempt streams the
// rest through, and an atomic one spills the rest to a temporary file that
// is sent after the commit.
func WithMaxResponseBody(n int64) Option {
	return engineOption(func(c *config) error {
		if n < 0 {
			return fmt.Errorf("%w: negative response body limit", ErrConfig)
		}
		c.maxResponse = n
		return nil
	})
}

// WithRecordedHeaders replaces the allowlist of recorded response headers
// (default DefaultRecordedHeaders). Names match case-insensitively: a
// header the handler set under a spelling of its own (w.Header()["ETag"])
// is recorded and replayed under that spelling. Set-Cookie, Authorization,
// hop-by-hop headers and Content-Length are never recorded, in any
// spelling, even when listed.
func WithRecordedHeaders(names ...string) Option {
	return engineOption(func(c *config) error {
		c.recorded = c.recorded[:0]
		for _, n := range names {
			n = http.CanonicalHeaderKey(n)
			if !neverRecorded[n] && !slices.Contains(c.recorded, n) {
				c.recorded = append(c.recorded, n)
			}
		}
		return nil
	})
}

// WithSealer seals recorded responses at rest (default: none). See seal.NewAESGCM.
func WithSealer(s seal.Sealer) Option {
	return engineOption(func(c *config) error { c.sealer = s; return nil })
}

// WithFailOpen runs handlers without protection when the store is
// unreachable, logging every such request at error level. The default is to
// fail closed with 503 and Retry-After. In atomic mode the store is the
// business database, so requests still fail with 503. A record that was
// found but cannot be used (its response does not decode or unseal, a
// resolver's outcome cannot be recorded) still answers 503: running the
// handler again could repeat what the first attempt did.
func WithFailOpen() Option {
	return engineOption(func(c *config) error { c.failOpen = true; return nil })
}

// WithProblemBase sets the prefix of the problem documents' type URIs
// (default DefaultProblemBase); the suffix is stable per error, see Problem.
func WithProblemBase(base string) Option {
	return engineOption(func(c *config) error { c.problemBase = base; return nil })
}

// WithErrorWriter replaces the writer of problem documents (default
// WriteProblem): every rejection the engine answers over HTTP is written
// with w.
func WithErrorWriter(w func(w http.ResponseWriter, r *http.Request, p *Problem)) Option {
	return engineOption(func(c *config) error {
		if w == nil {
			return fmt.Errorf("%w: WithErrorWriter(nil)", ErrConfig)
		}
		c.errorWriter = w
		return nil
	})
}

// WithResolver sets the function that settles indeterminate records
// (default: none, so the recorded 5xx is replayed). Given to New it is
// every route's; given to one route (Engine.Route, Engine.Handler, an
// adapter's New, Once), that route's own, used instead of the engine's:
// the route that makes the external call knows how to ask about it.
func WithResolver(r Resolver) RouteOption {
	rp := &r // one identity per option, which nestable compares
	return routeOption(func(p *policy) { p.resolver = rp })
}

// WithObserver sets a hook called for every decision (default: none), for
// metrics (Prometheus, OpenTelemetry) without a dependency in core.
func WithObserver(o observe.Observer) Option {
	return engineOption(func(c *config) error { c.observer = o; return nil })
}

// WithLogger sets the logger (default slog.Default()). Routine decisions
// log at debug level: executions, replays, in-flight rejections (409),
// mismatches (422), releases, resolutions and invalid requests (400, 413,
// and 401 when the caller function names nobody), so a storm of
// duplicates logs nothing at the default info level. What an operator must
// act on logs at warn (indeterminate outcomes, lost leases, a caller,
// fingerprint or resolver function that failed, a lease extension that
// failed) or at error (store errors, fail-open, releases and sweeps that
// failed, wiring faults such as a body read before the middleware or a
// request refused as not protected). Only an operator's actions
// (Engine.ResolveRecord, Engine.ReleaseRecord, done or refused) and the
// Completer's settlements (settled, released, finished) log at info,
// with the record's id; a record the completer leaves for the operator,
// and its failures, at warn.
func WithLogger(l *slog.Logger) Option {
	return engineOption(func(c *config) error {
		if l == nil {
			return fmt.Errorf("%w: WithLogger(nil)", ErrConfig)
		}
		c.logger = l
		return nil
	})
}

// WithRawKeysInLogs logs and reports idempotency keys as sent (default: the
// first 16 hex digits of their SHA-256).
func WithRawKeysInLogs() Option {
	return engineOption(func(c *config) error { c.logRawKeys = true; return nil })
}

// Scope names a namespace of keys explicitly (default: none, the empty
// scope). A record is identified by (caller, scope, key): by default a key
// is unique within its caller, whatever the route, as Stripe's keys are
// within an account, and a key sent to another route is a key reused for
// a different request (the default fingerprint covers the method and the
// concrete path): 422. The scope never comes from the router (not its
// route pattern, not the path), so a request keeps its identity when the
// service moves to another router or renames a route parameter. A route
// that names a scope gets keys of its own: the same key on a route
// outside it is another record. A hand-written name survives refactoring
// of routes; routes that share it share records.
func Scope(name string) RouteOption {
	if strings.TrimSpace(name) == "" {
		panic("idem: Scope with an empty name")
	}
	if name == guardScope {
		panic("idem: Scope(" + strconv.Quote(name) + ") is reserved for the engine's effect guards")
	}
	return routeOption(func(p *policy) { p.scope = name })
}

// Retention sets how long records live (default DefaultRetention). Clients
// must be told this window: a retry after it executes again. It counts from
// the claim of the first request in atomic mode (the claim and the recorded
// answer commit together; a handler that outlives the retention gets it
// from its answer), and from the recorded answer in leased mode.
func Retention(d time.Duration) RouteOption {
	if d <= 0 {
		panic("idem: Retention must be positive")
	}
	return routeOption(func(p *policy) { p.retention = d })
}

// MaxAttempt bounds how long one attempt may run (default
// DefaultMaxAttempt, 5 minutes; 0: unbounded). An attempt outlives its
// client (docs/contract.md, section 5 "Atomic and leased modes"), so without a bound a handler stuck on an
// external call without a timeout would hold its key (409 to every retry)
// and, in atomic mode, its transaction for as long as the process lives.
// At the bound the handler's context ends with cause ErrAttemptTimeout
// (in atomic mode the transaction with it); in leased mode the lease is no
// longer extended, so it lapses and a retry can take over (the stale
// attempt's completion is fenced). What the handler answers then is
// classified as always: a 5xx before MarkEffect releases the key, after it
// the outcome is indeterminate.
func MaxAttempt(d time.Duration) RouteOption {
	if d < 0 {
		panic("idem: MaxAttempt must not be negative")
	}
	return routeOption(func(p *policy) { p.maxAttempt = d })
}

// WaitInFlight makes an in-flight duplicate wait up to d for the first
// request, then replay its result, or answer 409 if it is still running.
// The default (d = 0) rejects in-flight duplicates at once with 409 and
// Retry-After.
func WaitInFlight(d time.Duration) RouteOption {
	if d < 0 {
		panic("idem: WaitInFlight must not be negative")
	}
	return routeOption(func(p *policy) { p.wait = d })
}

// Leased selects leased mode on a store that supports atomic mode: the claim
// commits first, with a lease, and the handler runs outside any store
// transaction of the engine's. Use it for handlers whose effects live
// outside the database. The record is written on its own connection even
// when the request's context carries a transaction of the store (a
// transaction-per-request middleware's, sqlstore.WithTx, gormstore.WithTx);
// the handler's context keeps that transaction for the application's own
// writes. The handler's context is not cancelled when the client
// disconnects, only when the lease is lost. Stores without transactions
// are always in leased mode.
func Leased() RouteOption { return routeOption(func(p *policy) { p.leased = true }) }

// Atomic requires atomic mode: the handler's writes commit with the
// record, in one transaction of the store. It changes nothing on an engine
// over a TxStore (atomic is its default), and makes the route fail when
// it is built on any other store (a Redis store, memstore without
// Atomic()): Engine.Route, and so the adapters' New, panic with an error
// wrapping ErrConfig that names the SQL stores. A route that relies on its
// handler's writes rolling back with a failed attempt says so with it, so
// that moving it to a store without transactions fails at start-up, not
// as a second charge. Atomic and Leased exclude each other.
func Atomic() RouteOption { return routeOption(func(p *policy) { p.atomic = true }) }

// Fingerprint replaces the request fingerprint (default DefaultFingerprint,
// which covers the method, path, query and body). f replaces all of it:
// whatever f leaves out, two requests under one key may differ in and still
// replay each other.
func Fingerprint(f Fingerprinter) RouteOption {
	if f == nil {
		panic("idem: Fingerprint(nil)")
	}
	return routeOption(func(p *policy) { p.fingerprint = f })
}

// KeyOptional lets covered requests without a key pass through unprotected
// (default: the key is required and its absence answers 400).
func KeyOptional() RouteOption { return routeOption(func(p *policy) { p.optionalKey = true }) }

// Methods sets the covered request methods (default POST and PATCH); other
// methods pass through untouched.
func Methods(methods ...string) RouteOption {
	if len(methods) == 0 {
		panic("idem: Methods needs at least one method")
	}
	ms := make([]string, len(methods))
	for i, m := range methods {
		ms[i] = strings.ToUpper(m)
	}
	return routeOption(func(p *policy) { p.methods = ms })
}

// Name names the route for the Completer (default: unnamed, so its records
// are settled only when a client comes back). A named route marks every
// record it claims (ClaimRequest.Mark: a small row beside the record,
// written by the claim itself, so that a process that dies right after
// its claim leaves a marked record), and the
// completer settles the records of a marked route that are indeterminate
// or whose lease lapsed with that route's resolver (WithResolver), without
// a client. The name identifies the route across deployments and
// replicas, since nothing else in a record does (the router's pattern is
// only a label): keep it stable, and give it to one route of an engine
// (two routes built with the same name and different options panic). At
// most MaxRouteName bytes; an empty name panics.
func Name(name string) RouteOption {
	if name == "" || len(name) > store.MaxRouteName {
		panic(fmt.Sprintf("idem: Name must be 1 to %d bytes, got %d", store.MaxRouteName, len(name)))
	}
	return routeOption(func(p *policy) { p.name = name })
}

// RecordRequest records the request with the route's records (default:
// not recorded, so records stay small): its method, path with query,
// caller and body, or what fields chooses from the body (nil: the whole
// body, at most WithMaxRequestBody bytes: the fields a resolver needs, an
// amount, an account, so that a record keeps no more of the request than
// that; an error of fields refuses the request with 400,
// ErrInvalidRequest, before it runs), sealed with the engine's
// Sealer. A resolver reads it with ResolvingRequest, and Finish runs it
// again. It is written with the route's mark, so it is kept only on a
// named route (Name) and on a store that implements Settler; on a
// client's duplicate ResolvingRequest gives that duplicate's request
// either way.
func RecordRequest(fields func(body []byte) ([]byte, error)) RouteOption {
	fp := &fields
	return routeOption(func(p *policy) { p.record = fp })
}

// Finish lets the Completer run a record's request again, in the
// background, when the route's resolver answers OutcomeNotApplied
// (default: the record is released, and the next retry with its key
// runs). The completer releases the record and claims it again as an
// attempt of its own (a client retrying meanwhile gets 409 with
// Retry-After, and a finisher that dies is a lapsed lease like any
// other); fn's answer is classified and recorded as a handler's. It needs
// RecordRequest and Name: fn runs only what was recorded. On a store on a
// multi-primary cluster (MultiPrimary: MariaDB Galera) the completer
// refuses to run it on an atomic route; make such a route Leased.
//
// fn does what the route's handler does for the request req
// (ResolvingRequest(ctx) gives it too) and returns the answer to record.
// Its context carries the attempt as a handler's does: MarkEffect,
// Release, DownstreamKey (the same keys as the first attempt's) and, in
// atomic mode, the transaction (sqlstore.Tx, gormstore.DB, pgxstore.Tx)
// work with it. A nil Response is a 500.
func Finish(fn func(ctx context.Context, req RecordedRequest) *Response) RouteOption {
	if fn == nil {
		panic("idem: Finish(nil)")
	}
	fp := &fn
	return routeOption(func(p *policy) { p.finish = fp })
}
