package core

import (
	"errors"
	"fmt"
	"time"

	"github.com/idemkit/idem/internal/errconfig"
)

// Sentinel errors. Every rejection the middleware answers with a problem
// document maps to one of these, so callers of the Go API (Engine.Once)
// can match them with errors.Is. Stores translate driver errors
// into ErrNotFound, ErrFenced and ErrStoreUnavailable.
var (
	// ErrMissingKey: a covered request has no Idempotency-Key and the key is
	// required (HTTP 400).
	ErrMissingKey = errors.New("idem: Idempotency-Key header is required")
	// ErrInvalidKey: the Idempotency-Key is empty, too long, has control
	// characters, is a malformed quoted string, or appears more than once
	// (HTTP 400).
	ErrInvalidKey = errors.New("idem: malformed Idempotency-Key")
	// ErrMismatch: the key was used before with a different request
	// fingerprint (HTTP 422).
	ErrMismatch = errors.New("idem: Idempotency-Key reused with a different request")
	// ErrInProgress: a request with the same identity is still running
	// (HTTP 409 with Retry-After). Returned wrapped in a *RetryError.
	ErrInProgress = errors.New("idem: a request with this Idempotency-Key is in progress")
	// ErrStoreUnavailable: the store could not be reached or failed (HTTP 503
	// with Retry-After). Stores wrap driver errors with it.
	ErrStoreUnavailable = errors.New("idem: idempotency store unavailable")
	// ErrInvalidRequest: the request body could not be read or
	// fingerprinted (HTTP 400).
	ErrInvalidRequest = errors.New("idem: request body could not be read")
	// ErrBodyTooLarge: the request body exceeds the fingerprint limit (HTTP 413).
	ErrBodyTooLarge = errors.New("idem: request body too large to fingerprint")
	// ErrBodyConsumed: the request announced a body (Content-Length) but
	// less was left to read: something before the middleware consumed it,
	// so it cannot be fingerprinted (HTTP 500: a wiring error of the
	// server, logged with the fix; never fingerprinted as empty).
	ErrBodyConsumed = errors.New("idem: the request body was consumed before the idempotency middleware")
	// ErrNotProtected: an adapter could not establish how to protect the
	// request (for example which route it reaches, when a middleware after
	// it rewrites the path), so it refuses it instead of passing it
	// through unprotected (HTTP 500: a wiring error of the server, logged
	// with the fix).
	ErrNotProtected = errors.New("idem: the request could not be protected")
	// ErrNoCaller: the caller function could not identify the caller (HTTP 401).
	ErrNoCaller = errors.New("idem: caller not identified")
	// ErrNotKept: the first response was too large or streamed, so its body
	// was not recorded; a replay can only give its status (HTTP: the
	// recorded status with a problem document).
	ErrNotKept = errors.New("idem: the recorded response body was not kept")
	// ErrIndeterminate: an earlier attempt may have had an effect and its
	// outcome is not known; the request is not executed again.
	ErrIndeterminate = errors.New("idem: outcome of an earlier attempt is indeterminate")
	// ErrOutcomePending: the handler marked an external effect and its
	// answer could not be recorded (the store failed at that moment): the
	// outcome is being settled (by a takeover of the lapsed lease, or the
	// next retry's reading of the record), so the client is told to retry
	// with the same key (HTTP 503 with Retry-After), never given an
	// unrecorded answer.
	ErrOutcomePending = errors.New("idem: the outcome is being settled")
	// ErrLeaseLost: the attempt lost its lease to a takeover; its completion
	// was refused (HTTP 409 with Retry-After, so the client fetches the
	// new owner's answer).
	ErrLeaseLost = errors.New("idem: lease lost to another attempt")
	// ErrInternal: the request failed inside the engine in a way that is
	// no client's fault and has no kind of its own (an answer past the
	// recording cap that could not be spilled to its temporary file, a
	// handler that panicked, a misused Route.Within) (HTTP 500, problem
	// type internal). It is the Err of such a Problem; the cause (a
	// temporary path, an OS error, a panic value) goes to the log only.
	ErrInternal = errors.New("idem: internal error")
	// ErrConfig: New or an adapter was given an invalid configuration
	// (and the store SPI's parsers and ListQuery.Check, package store,
	// wrap it for invalid input).
	ErrConfig = errconfig.Err

	// ErrNoAttempt: DownstreamKey, MarkEffect or Release was called with a
	// context that carries no protected request: usually a framework's
	// context (*gin.Context, echo.Context) instead of the request's
	// (c.Request.Context(), c.Request().Context(), r.Context()), or a
	// request that passed through unprotected (method not covered,
	// KeyOptional without a key, fail-open).
	ErrNoAttempt = errors.New("idem: the context carries no protected request")
	// ErrNoTx: a store's transaction accessor (sqlstore.Tx, gormstore.DB)
	// was called with a context that carries no transaction of the store:
	// a framework's context instead of the request's, a Leased route (idem
	// holds no transaction for it), or code outside a protected request.
	ErrNoTx = errors.New("idem: the context carries no transaction")

	// ErrNotFound: a store has no live record for the identity (absent or
	// expired).
	ErrNotFound = errors.New("idem: record not found")
	// ErrAttemptTimeout is the cause (context.Cause) with which a
	// handler's context ends when its attempt ran for MaxAttempt.
	ErrAttemptTimeout = errors.New("idem: the attempt ran for MaxAttempt")
	// ErrFenced: a store refused Complete, Extend or Release because the
	// record is gone or its fencing token differs from the caller's.
	// Engine.ResolveRecord and Engine.ReleaseRecord return it for a
	// completed record (a recorded answer is final) and when the record
	// changed since they read it (another attempt or settler got there
	// first; nothing was changed).
	ErrFenced = errors.New("idem: fencing token does not match")
	// ErrTxAborted: the database aborted the transaction a store method
	// ran in, so nothing more can be written or committed in it: on
	// Postgres a statement of the handler failed (SQLSTATE 25P02 for every
	// later statement) or the transaction hit a serialization failure or a
	// deadlock (40001, 40P01); on MySQL/MariaDB the transaction was chosen
	// as a deadlock victim or failed Galera certification (error 1213) and
	// was rolled back: that error matches ErrLostRace too. In
	// middleware-managed atomic mode the engine handles it (see
	// Store.Complete); with the caller's own transaction (sqlstore.WithTx,
	// gormstore.WithTx) Once returns it: roll the transaction back; the
	// work may be retried in a new one.
	ErrTxAborted = errors.New("idem: the database aborted the transaction")
	// ErrLostRace: a store's claim, write or commit lost to a concurrent
	// transaction and the database rolled the whole transaction back:
	// nothing it wrote persists. On a multi-primary cluster (MariaDB
	// Galera) this is how a node learns that another node claimed the same
	// identity first (a failed certification, or a brute-force abort by
	// the other node's replicated write); on a single MySQL/MariaDB
	// server, a deadlock victim (error 1213 in both cases). The engine
	// answers it like any duplicate of an attempt that is in flight or
	// completed (409 + Retry-After, or the replay), never as an outage.
	// Stores return it wrapped; inside a transaction it comes with
	// ErrTxAborted (the transaction is dead). Postgres's stores do not
	// return it: there the claims of one identity serialize on an advisory
	// lock and the unique index, so two attempts never both reach their
	// commit, and a serialization failure or deadlock (40001, 40P01) is
	// about the handler's own rows: ErrTxAborted alone (docs/decisions.md).
	ErrLostRace = errors.New("idem: lost a race to a concurrent transaction (rolled back)")
)

// RetryError carries a Retry-After hint with a sentinel (ErrInProgress,
// ErrStoreUnavailable, ErrLeaseLost). errors.Is(err, ErrInProgress) matches it.
type RetryError struct {
	Err        error
	RetryAfter time.Duration
}

func (e *RetryError) Error() string {
	return fmt.Sprintf("%v (retry after %v)", e.Err, e.RetryAfter)
}

func (e *RetryError) Unwrap() error { return e.Err }
