package scenario

// scenarios is the suite Run runs, in order. Every row of CONTRACT sections
// 3 and 4 has at least one scenario.
var scenarios = []scenario{
	// Recording and replay.
	{"ok, the first request runs and its answer reaches the client", "The first request with a key runs the handler, which reads the whole request body, and its answer reaches the client unchanged, without Idempotent-Replayed.", both, testFirstRuns},
	{"ok, replays the stored 201 with Idempotent-Replayed", "A duplicate (same caller, scope, key and body) gets the recorded status, body and recorded headers (Content-Type, Location, ETag, every value of a repeated header in order) plus Idempotent-Replayed: true, and the handler does not run again.", both, testReplay},
	{"ok, 2xx, 3xx and 4xx other than 408 and 429 are recorded and replayed", "Every answer below 500 except 408 and 429 completes the record, and a duplicate replays it.", both, testRecordedStatuses},
	{"ok, Set-Cookie and Authorization are never replayed, even when allowlisted", "Set-Cookie and Authorization reach the first client but are never recorded, even when WithRecordedHeaders lists them; other listed headers are replayed.", both, testNeverRecorded},
	{"ok, headers outside the allowlist are not replayed", "Only allowlisted response headers are recorded; the others reach the first client only.", both, testAllowlist},

	// Keys.
	{"ok, the raw and the quoted form of a key address the same record", "Idempotency-Key: abc, Idempotency-Key: \"abc\" and the key with surrounding whitespace address the same record.", both, testKeyForms},
	{"ok, a 255-byte key is accepted", "A key of 255 bytes, raw or quoted, is valid and protects the request.", both, testLongestKey},
	{"nok, 400 on a missing or malformed key", "A covered request without a key, or with an empty, blank, over-long, control-character, duplicated, comma-joined or badly quoted key, gets a 400 problem document (missing-key or invalid-key) and the handler does not run.", both, testBadKeys},
	{"ok, KeyOptional lets a keyless request through unprotected", "With KeyOptional a request without a key runs every time, unprotected; a request with a key is still protected, and a malformed key is still a 400.", both, testKeyOptional},

	// Fingerprint.
	{"nok, 422 on a different body", "A request under a used key with a different body gets a 422 key-reused problem document: nothing runs, nothing is replayed, and the record is unchanged.", both, testMismatch},
	{"ok, the same JSON or form written differently is a replay, not a 422", "Reformatted JSON, reordered keys, 1.0 for 1 and reordered form fields have the same fingerprint: the duplicate is a replay.", both, testCanonicalBody},
	{"ok, a record without a fingerprint is not contradicted", "A record stored without a fingerprint replays to any later request under its key, whatever its body.", both, testNoFingerprint},
	{"nok, 422 when one key is sent to another resource", "The same key, caller and body sent to /orders/1/payments and then to /orders/2/payments is a key reused for a different request: a 422, never order 1's answer; the handler runs once.", both, testOtherResource},
	{"nok, 422 when one key is sent with another query", "The same key sent with ?dry_run=true and then ?dry_run=false (or no query) gets a 422; parameters reordered or escaped differently are the same query and replay; repeated values reordered are not.", both, testOtherQuery},
	{"nok, 422 when one key is sent with another method under one scope", "Two routes sharing an explicit Scope, POST and PATCH: the same key and body with the other method gets a 422.", both, testOtherMethod},
	{"nok, 422 when member names that collide case-insensitively come in another order", "A JSON body whose member names repeat or are equal but for case (encoding/json: case-insensitive, last wins) is not reordered: the same members in another order get a 422.", both, testCaseCollision},

	// In flight.
	{"nok, 409 with Retry-After at once while the first is in flight", "By default a duplicate of a request that is still running gets a 409 in-progress problem document with Retry-After before the first finishes, never waiting for it, and the handler does not run again.", both, testInFlightReject},
	{"ok, WaitInFlight replays the first's answer once it finishes", "With WaitInFlight a duplicate waits for the running first request and then replays its answer; the handler runs once.", both, testInFlightWaitReplay},
	{"nok, WaitInFlight answers 409 when the bound passes", "With WaitInFlight a duplicate still waiting when the bound passes gets a 409 in-progress problem document with Retry-After; the handler runs once.", both, testInFlightWaitTimeout},
	{"ok, 50 concurrent identical requests run the handler once", "Of 50 concurrent identical requests over TCP exactly one runs the handler; every other gets its 201 replayed or a 409 in-progress.", both, testConcurrent},

	// Callers.
	{"ok, another caller using the same key gets its own execution", "Caller B sending caller A's key, completed or in flight, with the same or another body, gets its own execution and never A's body, 409 or 422.", both, testCallerIsolation},
	{"nok, 401 when the caller is not identified", "A covered request whose caller cannot be identified gets a 401 unauthenticated problem document and the handler does not run.", both, testNoCaller},

	// Released outcomes.
	{"ok, 408 and 429 release the key: a retry runs again", "A 408 or 429 answer releases the record, so a retry with the same key runs the handler again.", both, testReleaseStatuses},
	{"ok, core.Release releases the key whatever the answer", "A handler that calls core.Release gets its answer delivered, and the record is released, so a retry runs again even after a 400.", both, testExplicitRelease},
	{"ok, a panic releases the key and reaches the outer recovery", "A panicking handler releases the record and its panic propagates to the outer recovery; a retry runs again.", both, testPanicReleases},

	// 5xx and indeterminate outcomes.
	{"ok, 5xx before MarkEffect releases the key: a retry runs", "A 5xx with no external effect marked reaches the client and releases the record (atomic mode: the transaction rolls back; leased mode: nothing happened yet), so a retry runs again.", both, test5xxBeforeEffectReleases},
	{"ok, a 5xx before MarkEffect releases, a 5xx after it is indeterminate", "A first attempt that answers 5xx before marking an effect is released; the retry that answers 5xx after core.MarkEffect leaves the record indeterminate, and later requests replay that 5xx without running the handler.", both, test5xxBeforeThenAfterEffect},
	{"ok, 5xx after MarkEffect is indeterminate and the retry replays it", "A 5xx after core.MarkEffect leaves the record indeterminate: a retry replays the recorded 5xx with Idempotent-Replayed and the handler does not run.", both, testEffect5xxIndeterminate},
	{"ok, a panic after MarkEffect is indeterminate and the retry replays a 500", "A panic after core.MarkEffect propagates to the outer recovery and leaves the record indeterminate: a retry replays a 500 problem document and the handler does not run.", both, testEffectPanicIndeterminate},
	{"ok, a Resolver settles an indeterminate record as applied", "A Resolver that answers OutcomeApplied completes the indeterminate record with its response, which the retry and later duplicates replay; the handler does not run again and the resolver is asked once; DownstreamKeyFor gives the resolver the handler's downstream key.", both, testResolverApplied},
	{"ok, a Resolver settles an indeterminate record as not applied: the retry runs", "A Resolver that answers OutcomeNotApplied releases the indeterminate record, so the retry runs the handler, and later duplicates replay the retry's answer.", both, testResolverNotApplied},

	// Response body cap and streaming.
	{"ok, a body over the cap reaches the first client; the replay says it was not kept", "A response body over WithMaxResponseBody reaches the first client whole; a duplicate gets the recorded status with a response-not-kept problem document and the handler does not run.", both, testResponseCap},
	{"ok, leased: a flushed response reaches the first client; the replay says it was not kept", "In leased mode a handler that flushes streams its whole answer to the first client; a duplicate gets the recorded status with a response-not-kept problem document and the handler does not run.", leased, testFlushLeased},
	{"ok, leased: a hijacked response reaches the first client; the replay says it was not kept", "In leased mode a handler can hijack the connection through the adapter; a duplicate gets a final (non-1xx) answer with a response-not-kept problem document and the handler does not run.", leased, testHijackLeased},
	{"ok, atomic: Flush is deferred and the body is kept", "In atomic mode nothing reaches the client before the commit: Flush is deferred, the whole body is recorded, and a duplicate replays it.", atomicMode, testFlushAtomic},
	{"ok, atomic: past the cap the answer spills to a file, commits, then streams; memory stays bounded", "In atomic mode a 50 MiB answer is not held: past the recording cap the rest spills to a temporary file while the handler keeps its transaction; when it returns the record commits (status, body not kept) before the client sees anything, then the held bytes and the file are sent, the heap stays far below 50 MiB, and a duplicate gets the status with a response-not-kept problem document.", atomicMode, testAtomicStreamPastCap},
	{"nok, atomic: when the commit of an answer past the cap fails the client gets 503 and none of the body", "In atomic mode, when the commit of an answer past the recording cap fails, the handler's writes (spilled) succeeded, the client gets the 503 store-unavailable problem and nothing of the handler's body, and the retry runs.", atomicMode, testAtomicCapCommitFails},
	{"nok, 413 on a request body over the limit", "A request body over WithMaxRequestBody, with or without Content-Length, gets a 413 body-too-large problem document and the handler does not run.", both, testRequestCap},
	{"nok, 413 on a request body over an upstream http.MaxBytesReader", "A request body over a limit the application set before the middleware (http.MaxBytesReader) gets a 413 body-too-large problem document, as over the engine's own limit, and the handler does not run.", both, testUpstreamBodyLimit},

	// Problem documents.
	{"ok, rejections use the configured problem base and error writer", "Every rejection (400, 401, 422) is written by the engine's error writer (WithErrorWriter) with types under its problem base (WithProblemBase).", both, testProblemShape},

	{"nok, no rejection carries internal error text", "No response (body or header) to any rejection (store failing at begin, claim, complete, commit or release, a record that cannot be opened, a caller, fingerprint or resolver function failing, a panic, a missing, malformed or reused key, a large body, a request in flight) carries the text of a store, driver or caller-function error; the problem carries a record_id, and the log has the internal error under the same id.", both, testNoInternalsReachTheClient},

	// Logging.
	{"ok, routine decisions log at DEBUG", "A storm of 30 requests with one key (one runs, 29 get 409), then a replay and a mismatch, logs nothing above DEBUG.", both, testRoutineDecisionsLogQuietly},

	// Methods.
	{"ok, GET, PUT and DELETE pass through untouched by default", "Only POST and PATCH are covered by default: GET, PUT and DELETE run every time, with or without a key (even a malformed one), and are never replayed.", both, testMethodsDefault},
	{"ok, core.Methods(\"PUT\") covers PUT", "With Methods(\"PUT\") a PUT needs a key and its duplicates are replayed.", both, testMethodsPut},

	// Store failures.
	{"nok, 503 with Retry-After when the store is down; the handler does not run", "When the store fails, a covered request gets a 503 store-unavailable problem document with Retry-After and the handler does not run (fail closed); once the store is back the request runs.", both, testStoreDown},
	{"ok, leased: WithFailOpen runs the handler when the store is down", "In leased mode with WithFailOpen a covered request runs unprotected when the store fails.", leased, testFailOpen},
	{"nok, atomic: WithFailOpen still answers 503", "In atomic mode the store is the business database, so WithFailOpen still answers 503 when it fails and the handler does not run.", atomicMode, testFailOpenAtomic},

	// Crashes and clients that go away.
	{"ok, atomic: a retry waits for an attempt whose client went away and gets its answer", "In atomic mode a request whose client went away keeps its claim until the handler ends: a retry under the wait policy waits and replays its answer; the handler runs once.", atomicMode, testAtomicCrash},
	{"ok, leased: the outcome is recorded even when the client went away", "In leased mode, when the client hangs up while the handler runs, the handler's outcome is still recorded and a retry replays it.", leased, testLeasedClientGone},
	{"ok, an attempt is bounded by MaxAttempt", "An attempt outlives its client but not MaxAttempt: at the bound its context ends with cause ErrAttemptTimeout; a 5xx before MarkEffect then releases the key and the retry runs.", both, testMaxAttempt},
	{"ok, leased: a client that goes away after MarkEffect does not cancel the attempt", "In leased mode the handler's context does not end when the client goes away: the attempt runs to its end, records its 201, and the retry replays it; the handler runs once.", leased, testLeasedClientGoneAfterEffect},
	{"ok, a handler that reads the body after its request was answered reads its own bytes", "A handler behind http.TimeoutHandler inside the protected route that reads the request body after the timeout answered the client (the engine's Serve has returned), while other requests run, reads its own request's body whole and never another request's bytes.", both, testLateBodyReader},
	{"ok, atomic: a client that goes away does not cancel the attempt", "In atomic mode, as in leased mode, the handler's context and transaction do not end when the client goes away: the attempt records its 201 and the retry replays it; the handler runs once.", atomicMode, testAtomicClientGone},

	// Leases.
	{"ok, leased: a lapsed lease is taken over; the old attempt's completion is refused", "In leased mode a request meeting a lapsed lease takes the record over and runs (attempt 2, same downstream key); the old attempt's completion is refused and its client gets a 409 lease-lost; duplicates replay the new attempt's answer.", leased, testTakeover},
	{"nok, leased: 422 when a different body meets a lapsed lease", "A request with a different body under a key whose first attempt's lease lapsed is a mismatch (422), not a takeover: the key stays bound to the first request.", leased, testTakeoverMismatch},
	{"ok, leased: WithoutTakeover() makes a lapsed record indeterminate", "With WithoutTakeover() a request meeting a lapsed lease does not run: the record becomes indeterminate and a 500 outcome-unknown problem document is replayed.", leased, testNoTakeover},

	// Retention.
	{"ok, after the retention window the same key executes again", "A duplicate within the Retention window replays; after it the record is absent and the same key runs the handler again.", both, testRetention},

	// Sealing.
	{"ok, a sealed record replays byte for byte and keeps no plaintext at rest", "With WithSealer(seal.NewAESGCM) the replay is identical to the first answer and the stored response holds no plaintext of the body.", both, testSealing},

	// Scope.
	{"ok, routes with the same explicit Scope share records", "Two routes with the same core.Scope name share records: the same key on the second route meets the first route's record, and since the fingerprint covers the path, gets a 422 whatever the body; the second handler never runs.", both, testExplicitScope},
	{"ok, by default different routes never share a record", "The default scope is the route: the same key on two routes runs each handler.", both, testDefaultScopeDistinct},
	{"ok, the default scope is the route pattern, not the concrete path", "Requests to /orders/1/refunds and /orders/2/refunds with the same key, caller and body address one record: the second, whose path differs, gets a 422 from it (a record of its own would have run the handler).", both, testPatternScope},

	// The handler's context.
	{"ok, the handler sees the engine's context", "The handler's request context carries the attempt (AttemptFrom: identity, attempt 1, the mode), a downstream key and, in atomic mode, the store's transaction.", both, testHandlerContext},
}

// globalScenarios is the suite RunGlobal runs.
var globalScenarios = []scenario{
	{"ok, replays the stored 201 with Idempotent-Replayed", "A duplicate gets the recorded answer plus Idempotent-Replayed: true, and the handler does not run again.", both, testReplay},
	{"ok, the default scope is the route pattern, not the concrete path", "Requests to /orders/1/refunds and /orders/2/refunds with the same key, caller and body address one record: the second, whose path differs, gets a 422 from it (a record of its own would have run the handler).", both, testPatternScope},
	{"ok, by default different routes never share a record", "The default scope is the route: the same key on two routes runs each handler.", both, testDefaultScopeDistinct},
	{"ok, GET, PUT and DELETE pass through untouched by default", "Only POST and PATCH are covered by default: GET, PUT and DELETE run every time and are never replayed.", both, testMethodsDefault},
	{"ok, the handler sees the engine's context", "The handler's request context carries the attempt, a downstream key and, in atomic mode, the store's transaction.", both, testHandlerContext},
	{"nok, 400 on a missing or malformed key", "A covered request without a key or with a malformed one gets a 400 problem document and the handler does not run.", both, testBadKeys},
	{"ok, the router's own 404 and 405 are untouched and unrecorded", "Requests the router rejects itself (unknown path: 404; known path, wrong method: 405 with Allow) get the router's answer, with or without a key, on every retry, never a problem document of the middleware, never a replay.", both, testRouterAnswers},
	{"nok, 422 when one key is sent to another resource", "The same key, caller and body sent to /orders/1/payments and then to /orders/2/payments gets a 422, never order 1's answer.", both, testOtherResource},
	{"nok, 422 when one key is sent with another query", "The same key sent with ?dry_run=true and then ?dry_run=false gets a 422; the query reordered replays.", both, testOtherQuery},
}
