package store

import (
	"context"
	"encoding/hex"
	"time"

	"github.com/idemkit/idem/internal/debugtext"
)

// ID is the fixed-size identity of a record: SHA-256 over the length-prefixed
// caller, scope and key (Identity.ID). Stores use it as the primary key,
// so neither the length nor the content of a key can break a store.
type ID [32]byte

// String returns the lowercase hex form of id (64 characters).
func (id ID) String() string { return hex.EncodeToString(id[:]) }

// State is the durable state of a record. Absent is not stored: a record that
// does not exist, or has expired, is absent.
type State uint8

const (
	// StateInProgress: an attempt holds the record (atomic mode: inside its
	// uncommitted transaction; leased mode: until LeaseUntil).
	StateInProgress State = 1
	// StateCompleted: the response is recorded; duplicates replay it.
	StateCompleted State = 2
	// StateIndeterminate: an attempt may have had an effect and failed; the
	// recorded response (a 5xx) is replayed until a core.Resolver settles it.
	StateIndeterminate State = 3
)

func (s State) String() string {
	switch s {
	case StateInProgress:
		return "in_progress"
	case StateCompleted:
		return "completed"
	case StateIndeterminate:
		return "indeterminate"
	}
	return "unknown"
}

// Record is one stored idempotency record.
type Record struct {
	ID ID
	// Caller, Scope and Key are kept for debugging only (truncated to
	// MaxDebugLen bytes of valid UTF-8); the identity is ID.
	Caller, Scope, Key string
	// Fingerprint of the first request, at most 32 bytes (the engine hashes
	// longer ones); nil or empty when none was computed (stores may return
	// either). A record without a fingerprint cannot be contradicted.
	Fingerprint []byte
	State       State
	// Token is the fencing token of the attempt that owns the record.
	Token int64
	// Attempt counts claims of this record: 1 for the first, +1 per takeover.
	Attempt int
	// LeaseUntil is when the owning attempt's lease lapses (leased mode);
	// zero in atomic mode and once completed.
	LeaseUntil time.Time
	// ExpiresAt is when the record becomes absent.
	ExpiresAt time.Time
	CreatedAt time.Time
	// Status is the recorded HTTP status (0 while in progress).
	Status int
	// Response is the encoded (and possibly sealed) recorded response; the
	// store keeps it byte for byte (nil and empty are the same).
	Response []byte
}

// Limits of a record's fields and of a listing.
const (
	MaxDebugLen  = debugtext.Max // the debug copies of caller, scope and key in a Record
	MaxRouteName = 100           // a route's name (core.Name, Mark.Route)
	MaxListLimit = 1000          // the most records one Inspector.List call returns
)

// ClaimRequest asks a store to create an in-progress record.
type ClaimRequest struct {
	ID                 ID
	Caller, Scope, Key string // debug copies, at most MaxDebugLen bytes each
	Fingerprint        []byte // nil: no fingerprint
	Token              int64  // fencing token chosen by the engine (never 0)
	Now                time.Time
	LeaseUntil         time.Time // zero in atomic mode
	ExpiresAt          time.Time
	// Takeover allows claiming an in-progress record whose lease lapsed
	// (LeaseUntil <= Now, LeaseUntil not zero). When false such a record is
	// returned as it is, and the engine decides.
	Takeover bool
	// Mark, when not nil, is the mark of the record the claim creates
	// (a route named with core.Name, on a Settler): a Settler writes it with
	// the claim, atomically (in the claim's statement or transaction),
	// under Token, when and only when the claim claims. So a claimed
	// record is never without its mark, even if the process dies right
	// after the claim. The engine sets it only for a Settler; nil for
	// every other route, which pays nothing for it.
	Mark *Mark
}

// ClaimResult is the answer to Store.Claim.
type ClaimResult struct {
	// Claimed reports that the caller now owns the record: it was absent,
	// expired, or (with Takeover) its lease had lapsed. Record is then the
	// new in-progress record (Attempt incremented on a takeover).
	Claimed bool
	// Record is, when Claimed is false, the live record that blocked the
	// claim. A store in atomic mode that detected another transaction
	// holding the identity without seeing its row returns a Record with only
	// ID and State (StateInProgress) set.
	Record Record
}

// Completion is what Store.Complete writes.
type Completion struct {
	State     State // StateCompleted or StateIndeterminate
	Status    int
	Response  []byte
	ExpiresAt time.Time
}

// Store keeps idempotency records. Every method takes the context first;
// methods called with a context returned by TxStore.Begin (or a context that
// carries a caller's transaction, see TxStore) run inside that transaction.
// Implementations must be safe for concurrent use. A method called outside a
// transaction on a record that another open transaction holds may wait for
// that transaction to end, except Claim, which never waits. Time is always passed in
// by the caller: a store never reads a clock for expiry decisions.
//
// A record is live when ExpiresAt > now. An expired record is absent for
// every method, even if a sweep has not yet deleted it.
//
// Memory: a store keeps its own copy of every byte slice it is given
// (ClaimRequest.Fingerprint, Completion.Response) and never retains the
// caller's slice after the method returns; the slices of a returned
// Record belong to the caller (storetest's NoAliasing checks both).
//
// Errors: stores return core.ErrNotFound and core.ErrFenced as documented, and wrap
// any other failure (network, driver, decoding) with core.ErrStoreUnavailable,
// except two:
//   - a method that runs in a transaction (TxStore) and finds that the
//     database has aborted it (Postgres refuses every statement after a
//     failed one; MySQL/MariaDB rolled a deadlock victim back) wraps the
//     driver's error with core.ErrTxAborted instead. The engine then records the
//     outcome in a transaction of its own (middleware-managed atomic mode)
//     or returns the error to the owner of the transaction
//     (caller-managed).
//   - a statement or commit that failed because the database rolled the
//     transaction back in favour of a concurrent one (a MySQL/MariaDB
//     deadlock victim; on a multi-primary cluster such as MariaDB Galera, a
//     failed certification or a brute-force abort by another node's write)
//     is wrapped with core.ErrLostRace (and, inside a transaction, core.ErrTxAborted
//     as well). The transaction's writes are then gone, so the engine
//     answers as it does for a duplicate of an in-flight or completed
//     attempt, not as an outage. A store retries such a failure itself
//     where nothing but its own statement was lost (a claim outside any
//     transaction, or as the first statement of one).
type Store interface {
	// Claim atomically creates an in-progress record from req.
	//   - missing or expired: the record is (re)created and Claimed is true;
	//     an expired record is replaced atomically (two concurrent claims of
	//     an expired record: exactly one wins).
	//   - existing, in progress, lease lapsed (LeaseUntil non-zero and <=
	//     req.Now) and req.Takeover: taken over atomically; Token,
	//     LeaseUntil, ExpiresAt and Fingerprint are set from req, Attempt is
	//     incremented, CreatedAt kept. Claimed is true.
	//   - existing otherwise: Claimed is false and Record is the existing
	//     record (whatever its state); nothing is written.
	// Claim does not wait for another attempt: in atomic mode a store
	// detects an uncommitted claim of the same ID by another transaction
	// with a non-blocking lock probe and reports it as StateInProgress. A
	// store on a database that admits one writer at a time (SQLite) may
	// instead wait for the other transaction to end and then answer from
	// what it committed; such a store says so in its documentation, and
	// storetest.SerialWriters adapts the conformance suite.
	Claim(ctx context.Context, req ClaimRequest) (ClaimResult, error)

	// Extend, Complete and Release are given no time: the record's state
	// and token decide. A record that expired but was neither swept nor
	// claimed again still holds its token, so its owner may still complete
	// it; a record that was swept or replaced fences the old owner.
	//
	// Extend moves the lease of the in-progress record id to leaseUntil
	// (and its ExpiresAt to at least leaseUntil).
	//   - missing, not in progress, or token differs: core.ErrFenced.
	Extend(ctx context.Context, id ID, token int64, leaseUntil time.Time) error

	// Complete records the outcome of the attempt that holds token.
	//   - existing with State in progress or indeterminate and the same
	//     token: State, Status, Response and ExpiresAt are set from c;
	//     LeaseUntil is cleared.
	//   - missing, completed, or a different token: core.ErrFenced.
	Complete(ctx context.Context, id ID, token int64, c Completion) error

	// Release deletes the record held by token, so the identity is absent.
	//   - existing (in progress or indeterminate) with the same token: deleted.
	//   - missing: no-op, nil.
	//   - different token, or completed: core.ErrFenced (nothing deleted).
	Release(ctx context.Context, id ID, token int64) error

	// Get returns the live record id.
	//   - missing or expired (ExpiresAt <= now): core.ErrNotFound.
	Get(ctx context.Context, id ID, now time.Time) (Record, error)

	// DeleteExpired deletes at most limit records with ExpiresAt <= now and
	// returns how many it deleted. It must not hold locks for long: callers
	// (see core.Sweeper) call it repeatedly until it returns fewer than limit.
	DeleteExpired(ctx context.Context, now time.Time, limit int) (int, error)
}

// Tx is a transaction begun by TxStore.Begin.
type Tx interface {
	Commit() error
	Rollback() error
}

// TxStore is a Store that can join a database transaction: atomic mode.
//
// Middleware-managed: the engine calls Begin, runs Claim, the handler and
// Complete with the returned context, and commits before the response is
// released. The transaction a context carries belongs to the store's
// package, not to one store value: a context that carries one database's
// transaction must not reach a store of another database. Caller-managed: the application puts its own transaction into a
// context with the store's helper (gormstore.WithTx, sqlstore.WithTx); the
// engine then sees InTx(ctx) and never begins, commits or rolls back.
type TxStore interface {
	Store
	// Begin starts a transaction and returns a context carrying it. Store
	// methods called with that context run in the transaction.
	Begin(ctx context.Context) (context.Context, Tx, error)
	// InTx reports whether ctx already carries a transaction of this store.
	InTx(ctx context.Context) bool
	// WithoutTx returns ctx with any transaction of this store that it
	// carries hidden: store methods called with the result run outside any
	// transaction (autocommit, on a connection of their own), InTx reports
	// false, and Begin starts a new transaction. Leased mode claims and
	// completes with it, so its record commits on its own whatever the
	// request's context carries (docs/contract.md, section 5 "Atomic and leased modes").
	WithoutTx(ctx context.Context) context.Context
}

// ListQuery selects the records Inspector.List returns: the live records
// of one state, oldest first, one bounded page at a time.
type ListQuery struct {
	// State is the state of the records listed: StateInProgress,
	// StateCompleted or StateIndeterminate (required).
	State State
	// Now is the time liveness is decided at: only records with
	// ExpiresAt > Now are listed (as for Get).
	Now time.Time
	// CreatedBefore, when not zero, lists only records created before it
	// (CreatedAt < CreatedBefore): Now minus a minimum age.
	CreatedBefore time.Time
	// After, when not zero, starts the page after this position: the
	// Cursor of the last record of the previous page.
	After Cursor
	// Limit is the most records returned, 1 to MaxListLimit (required).
	Limit int
}

// Cursor is a position in Inspector.List's order (CreatedAt, then ID):
// the Cursor of a record lists what comes after it. Its text form (String,
// parsed back by ParseCursor) is what idemctl and core.Engine.AdminHandler
// hand out as "next".
type Cursor struct {
	CreatedAt time.Time
	ID        ID
}

// CursorOf returns the position of rec in Inspector.List's order.
func CursorOf(rec Record) Cursor { return Cursor{CreatedAt: rec.CreatedAt, ID: rec.ID} }

// IsZero reports whether c is the zero Cursor (the start of the list).
func (c Cursor) IsZero() bool { return c.CreatedAt.IsZero() && c.ID == ID{} }

// Inspector is a Store whose records an operator can list: the records
// stuck in a state for longer than they should be (indeterminate, or in
// progress with a lapsed lease), which core.Engine.Records, idemctl and
// core.Engine.AdminHandler show. memstore, sqlstore, gormstore, pgxstore and redisstore
// implement it; storetest checks it for every store that does. Reading one
// record by its ID (the record_id of a problem document, ParseID) is
// Store.Get.
type Inspector interface {
	Store

	// List returns the live records (ExpiresAt > q.Now) in state q.State,
	// oldest first: ordered by CreatedAt, then by ID (bytewise), starting
	// after q.After and, with q.CreatedBefore, created before it; at most
	// q.Limit of them.
	//   - every field is as Get returns it, except Response, which is not
	//     read (nil): a page of records stays small whatever they
	//     recorded; Get reads one record with its response.
	//   - none: an empty slice (or nil) and no error. Fewer than q.Limit
	//     records: the end of the list.
	//   - q invalid (see ListQuery.Check): an error wrapping core.ErrConfig,
	//     nothing read.
	// List reads without locking and never waits for a transaction: a
	// record that another open transaction wrote (an atomic attempt's
	// claim) is listed as it was last committed, or not at all. It is an
	// operator's query, not one of the request path: a store may scan
	// the live records to answer it (no index covers state; see the
	// store's documentation).
	List(ctx context.Context, q ListQuery) ([]Record, error)
}

// Mark says that a record is to be settled without a client: a route
// named with core.Name writes it with its claim (ClaimRequest.Mark), and a
// core.Completer reads it back (Settler.Due).
type Mark struct {
	// Route is the name of the route that claimed the record (core.Name): the
	// completer settles the record with that route's resolver.
	Route string
	// Request is the recorded request (core.RecordRequest), encoded and sealed
	// by the engine; nil when the route records none. The store keeps it
	// byte for byte.
	Request []byte
	// After is when a completer may look at the record (next).
	After time.Time
	// Tries counts the completer's visits so far.
	Tries int
}

// Pending is a marked record that a completer may settle: Settler.Due's
// answer.
type Pending struct {
	// Record is the record as Get returns it, except Response, which is
	// not read (nil).
	Record Record
	Mark   Mark
}

// Settler is a Store that keeps marks, so a core.Completer can find the
// records that need settling without a client. memstore, sqlstore,
// gormstore and pgxstore implement it (the SQL stores in a table of its
// own, <table>_marks, which Migrate creates); storetest checks it for
// every store that does. Marks are written only for routes that opt in
// (core.Name): nothing of this interface runs for other routes.
//
// Claim writes the marks: a Settler's Claim given a ClaimRequest.Mark
// writes it, replacing any earlier mark of the id (whatever its token),
// in the same statement or transaction as the record it creates or takes
// over, and only then (a claim that does not claim writes no mark: the
// holder's stays). In atomic mode the mark commits or rolls back with
// the claim's transaction.
//
// A mark belongs to the record id under the token it was written with. A
// mark is live while its record is live (ExpiresAt > now), in progress or
// indeterminate, and holds the same token; a record completed, released,
// expired or claimed again under another token makes its mark stale.
type Settler interface {
	Store

	// Mark writes the mark of the record id under token on its own,
	// replacing any earlier mark of id (whatever its token), in the
	// transaction ctx carries, if any. It does not read the record. The
	// engine does not call it (its claims carry their marks,
	// ClaimRequest.Mark); it is for tools and tests that set a mark
	// without a claim (storetest seeds marks with it).
	Mark(ctx context.Context, id ID, token int64, m Mark) error

	// Due returns at most limit live marks whose After <= now, ordered
	// by After (earliest first), each with its record. Stale marks met
	// on the way are deleted (not returned), so they cost one visit at
	// most. limit is 1 to MaxListLimit (else an error wrapping
	// core.ErrConfig). Due reads without waiting for a transaction: a mark
	// written in an open transaction is returned once it commits.
	Due(ctx context.Context, now time.Time, limit int) ([]Pending, error)

	// Visit moves the mark of id, held under token and last read with
	// After seen, to after next with tries, and reports whether it did:
	// of several completers that read the same mark, exactly one visit
	// succeeds (a compare-and-set on After). The engine always passes a
	// next that differs from seen (a store may count changed rows).
	//   - no mark of id, another token, or After differs from seen:
	//     false, nil (nothing written).
	Visit(ctx context.Context, id ID, token int64, seen, next time.Time, tries int) (bool, error)
}

// Embedded is a TxStore whose database runs inside the process (SQLite).
// There a second connection cannot write while a transaction is open (one
// writer), and a transaction cannot end without the process that holds
// it knowing: the engine then writes no effect guard for core.MarkEffect
// (ID.EffectGuard), which would wait for the attempt's own transaction.
// sqlstore and gormstore implement it (true on SQLite only).
type Embedded interface {
	TxStore
	// Embedded reports whether the database runs inside the process.
	Embedded() bool
}

// MultiPrimary is a Store that can tell whether its database takes
// writes on several nodes at once, each node seeing another's only when
// it commits (a multi-primary cluster: MariaDB Galera). There an atomic
// claim on one node does not exclude an atomic claim of the same record
// on another until one of them commits, so two attempts may both run
// before certification rolls one back, and an effect outside the
// database (a provider's charge) is not rolled back with it. A core.Completer
// refuses to run a finisher (Finish) on an atomic route over such a
// store (core.Completer.Start, core.Completer.Complete: an error wrapping
// core.ErrConfig). sqlstore and gormstore implement it.
type MultiPrimary interface {
	Store

	// MultiPrimary reports whether the database is a multi-primary
	// cluster that the store's connections write to on more than one
	// node (sqlstore: @@wsrep_on on MariaDB, unless the store was told
	// that every process writes through one node).
	MultiPrimary(ctx context.Context) (bool, error)
}
