package scenario

// scenarios is the suite Run runs, in order. Every row of the tables in
// docs/contract.md, sections 3 "What a client observes" and 4 "Outcomes",
// has at least one scenario.
var scenarios = []scenario{
	// Recording and replay.
	{"FirstRequestRuns", "The first request with a key runs the handler, which reads the whole request body, and its answer reaches the client unchanged, without Idempotent-Replayed.", both, testFirstRuns},
	{"ReplaysRecordedAnswer", "A duplicate (same caller, scope, key and body) gets the recorded status, body and recorded headers (Content-Type, Location, ETag, every value of a repeated header in order) plus Idempotent-Replayed: true, and the handler does not run again.", both, testReplay},
	{"RecordedStatuses", "Every answer below 500 except 400, 408, 422 and 429 before an effect completes the record, and a duplicate replays it.", both, testRecordedStatuses},
	{"SecretHeadersNeverReplayed", "Set-Cookie and Authorization reach the first client but are never recorded, even when WithRecordedHeaders lists them; other listed headers are replayed.", both, testNeverRecorded},
	{"HeaderSpelling", "An allowlisted header the handler set under its own spelling (w.Header()[\"ETag\"], Go's way for a non-canonical name) is recorded and replayed, under that spelling; Set-Cookie and headers outside the allowlist are not, whatever their spelling.", both, testHeaderSpelling},
	{"HeaderAllowlist", "Only allowlisted response headers are recorded; the others reach the first client only.", both, testAllowlist},

	// Keys.
	{"KeyForms", "Idempotency-Key: abc, Idempotency-Key: \"abc\" and the key with surrounding whitespace address the same record.", both, testKeyForms},
	{"LongestKey", "A key of 255 bytes, raw or quoted, is valid and protects the request.", both, testLongestKey},
	{"BadKeys", "A covered request without a key, or with an empty, blank, over-long, control-character, duplicated, comma-joined or badly quoted key, gets a 400 problem document (missing-key or invalid-key) and the handler does not run.", both, testBadKeys},
	{"KeyOptional", "With KeyOptional a request without a key runs every time, unprotected; a request with a key is still protected, and a malformed key is still a 400.", both, testKeyOptional},

	// Fingerprint.
	{"BodyMismatch", "A request under a used key with a different body gets a 422 key-reused problem document: nothing runs, nothing is replayed, and the record is unchanged.", both, testMismatch},
	{"CanonicalBody", "Reformatted JSON, reordered keys, re-escaped strings and reordered form fields have the same fingerprint: the duplicate is a replay.", both, testCanonicalBody},
	{"NumbersByText", "JSON numbers are compared by their text, as Go's decoders read them: {\"amount\":1000} after {\"amount\":1e3} under one key is a 422, and 1, 1.0, 1e0 and 1.00 are four different requests; the same text reformatted or reordered replays.", both, testNumbersByText},
	{"ContentTypeCounts", "The Content-Type with its parameters is part of the fingerprint when there is a body: one multipart body under two boundaries, or the same bytes in two charsets, are two requests (the second gets a 422); a request without a body is the same request with or without a Content-Type.", both, testContentType},
	{"RecordWithoutFingerprint", "A record stored without a fingerprint replays to any later request under its key, whatever its body.", both, testNoFingerprint},
	{"OtherResource", "The same key, caller and body sent to /orders/1/payments and then to /orders/2/payments is a key reused for a different request: a 422, never order 1's answer; the handler runs once.", both, testOtherResource},
	{"OtherQuery", "The same key sent with ?dry_run=true and then ?dry_run=false (or no query) gets a 422; parameters reordered or escaped differently are the same query and replay; repeated values reordered are not.", both, testOtherQuery},
	{"OtherMethod", "Two routes sharing an explicit Scope, POST and PATCH: the same key and body with the other method gets a 422.", both, testOtherMethod},
	{"CaseCollidingMembers", "A JSON body whose member names repeat or are equal but for case (encoding/json: case-insensitive, last wins) is not reordered: the same members in another order get a 422.", both, testCaseCollision},

	// In flight.
	{"InFlightConflict", "By default a duplicate of a request that is still running gets a 409 in-progress problem document with Retry-After before the first finishes, never waiting for it, and the handler does not run again.", both, testInFlightReject},
	{"InFlightWaitReplays", "With WaitInFlight a duplicate waits for the running first request and then replays its answer; the handler runs once.", both, testInFlightWaitReplay},
	{"InFlightWaitTimeout", "With WaitInFlight a duplicate still waiting when the bound passes gets a 409 in-progress problem document with Retry-After; the handler runs once.", both, testInFlightWaitTimeout},
	{"ConcurrentDuplicates", "Of 50 concurrent identical requests over TCP exactly one runs the handler; every other gets its 201 replayed or a 409 in-progress.", both, testConcurrent},

	// Callers.
	{"CallerIsolation", "Caller B sending caller A's key, completed or in flight, with the same or another body, gets its own execution and never A's body, 409 or 422.", both, testCallerIsolation},
	{"NoCaller", "A covered request whose caller cannot be identified gets a 401 unauthenticated problem document and the handler does not run.", both, testNoCaller},

	// Released outcomes.
	{"ReleaseStatuses", "A 400 or 422 (a validation failure: execution never began) or a 408 or 429 answered before core.MarkEffect releases the record, so the corrected request or a retry with the same key runs the handler again.", both, testReleaseStatuses},
	{"AfterEffectNothingReleased", "After core.MarkEffect nothing releases the record: a 400 or 422 is recorded and replayed, a 408 or 429 is indeterminate and replayed, core.Release fails with ErrConfig; the handler does not run again.", both, testAfterEffectKept},
	{"ExplicitRelease", "A handler that calls core.Release gets its answer delivered, and the record is released, so a retry runs again even after a 400.", both, testExplicitRelease},
	{"PanicReleases", "A panicking handler releases the record and its panic propagates to the outer recovery; a retry runs again.", both, testPanicReleases},

	// 5xx and indeterminate outcomes.
	{"ServerErrorBeforeEffectReleases", "A 5xx with no external effect marked reaches the client and releases the record (atomic mode: the transaction rolls back; leased mode: nothing happened yet), so a retry runs again.", both, test5xxBeforeEffectReleases},
	{"ServerErrorBeforeThenAfterEffect", "A first attempt that answers 5xx before marking an effect is released; the retry that answers 5xx after core.MarkEffect leaves the record indeterminate, and later requests replay that 5xx without running the handler.", both, test5xxBeforeThenAfterEffect},
	{"ServerErrorAfterEffectIndeterminate", "A 5xx after core.MarkEffect leaves the record indeterminate: a retry replays the recorded 5xx with Idempotent-Replayed and the handler does not run.", both, testEffect5xxIndeterminate},
	{"PanicAfterEffectIndeterminate", "A panic after core.MarkEffect propagates to the outer recovery and leaves the record indeterminate: a retry replays a 500 problem document and the handler does not run.", both, testEffectPanicIndeterminate},
	{"ResolverApplied", "A Resolver that answers OutcomeApplied completes the indeterminate record with its response, which the retry and later duplicates replay; the handler does not run again and the resolver is asked once; store.ID.DownstreamKey gives the resolver the handler's downstream key.", both, testResolverApplied},
	{"ResolverNotApplied", "A Resolver that answers OutcomeNotApplied releases the indeterminate record, so the retry runs the handler, and later duplicates replay the retry's answer.", both, testResolverNotApplied},

	// Response body cap and streaming.
	{"ResponseOverCap", "A response body over WithMaxResponseBody reaches the first client whole; a duplicate gets the recorded status with a response-not-kept problem document and the handler does not run.", both, testResponseCap},
	{"LeasedFlush", "In leased mode a handler that flushes streams its whole answer to the first client; a duplicate gets the recorded status with a response-not-kept problem document and the handler does not run.", leased, testFlushLeased},
	{"LeasedHijack", "In leased mode a handler can hijack the connection through the adapter; a duplicate gets a final (non-1xx) answer with a response-not-kept problem document and the handler does not run.", leased, testHijackLeased},
	{"AtomicFlushDeferred", "In atomic mode nothing reaches the client before the commit: Flush is deferred, the whole body is recorded, and a duplicate replays it.", atomicMode, testFlushAtomic},
	{"AtomicSpillPastCap", "In atomic mode a 50 MiB answer is not held: past the recording cap the rest spills to a temporary file while the handler keeps its transaction; when it returns the record commits (status, body not kept) before the client sees anything, then the held bytes and the file are sent, the heap stays far below 50 MiB, and a duplicate gets the status with a response-not-kept problem document.", atomicMode, testAtomicStreamPastCap},
	{"AtomicSpillCommitFails", "In atomic mode, when the commit of an answer past the recording cap fails, the handler's writes (spilled) succeeded, the client gets the 503 store-unavailable problem and nothing of the handler's body, and the retry runs.", atomicMode, testAtomicCapCommitFails},
	{"RequestBodyOverLimit", "A request body over WithMaxRequestBody, with or without Content-Length, gets a 413 body-too-large problem document and the handler does not run.", both, testRequestCap},
	{"UpstreamBodyLimit", "A request body over a limit the application set before the middleware (http.MaxBytesReader) gets a 413 body-too-large problem document, as over the engine's own limit, and the handler does not run.", both, testUpstreamBodyLimit},

	// Problem documents.
	{"ProblemBaseAndWriter", "Every rejection (400, 401, 422) is written by the engine's error writer (WithErrorWriter) with types under its problem base (WithProblemBase).", both, testProblemShape},
	{"ProblemDocsLink", "Every problem document links to its documentation with Link: <docs>; rel=\"describedby\" (DefaultProblemDocs, or the URL WithProblemDocs sets).", both, testProblemDocs},

	// The key header.
	{"KeyHeaderOption", "With WithKeyHeader(\"x-idempotency-key\") the key is read from X-Idempotency-Key (names match case-insensitively): a duplicate replays; a request that sends only Idempotency-Key is missing its key (400, the problem names X-Idempotency-Key).", both, testKeyHeaderOption},

	{"NoInternalsReachTheClient", "No response (body or header) to any rejection (store failing at begin, claim, complete, commit or release, a record that cannot be opened, a caller, fingerprint or resolver function failing, a panic, a missing, malformed or reused key, a large body, a request in flight) carries the text of a store, driver or caller-function error; the problem carries a record_id, and the log has the internal error under the same id.", both, testNoInternalsReachTheClient},

	// Logging.
	{"RoutineDecisionsLogAtDebug", "A storm of 30 requests with one key (one runs, 29 get 409), then a replay and a mismatch, logs nothing above DEBUG.", both, testRoutineDecisionsLogQuietly},

	// Methods.
	{"DefaultMethods", "Only POST and PATCH are covered by default: GET, PUT and DELETE run every time, with or without a key (even a malformed one), and are never replayed.", both, testMethodsDefault},
	{"MethodsPut", "With Methods(\"PUT\") a PUT needs a key and its duplicates are replayed.", both, testMethodsPut},

	// Store failures.
	{"StoreDown", "When the store fails, a covered request gets a 503 store-unavailable problem document with Retry-After and the handler does not run (fail closed); once the store is back the request runs.", both, testStoreDown},
	{"LeasedFailOpen", "In leased mode with WithFailOpen a covered request runs unprotected when the store fails.", leased, testFailOpen},
	{"AtomicInAppTransactionRefused", "In atomic mode a request whose context already carries a transaction of the store (a transaction-per-request middleware's) is refused with a 500 not-protected problem document and the handler does not run: joined, its answer would reach the client before that transaction commits, and a failed commit would leave a 2xx without its effects.", atomicMode, testAtomicInAppTransaction},
	{"AtomicFailOpenRefused", "In atomic mode the store is the business database, so WithFailOpen still answers 503 when it fails and the handler does not run.", atomicMode, testFailOpenAtomic},

	// Crashes and clients that go away.
	{"AtomicClientGoneRetryWaits", "In atomic mode a request whose client went away keeps its claim until the handler ends: a retry under the wait policy waits and replays its answer; the handler runs once.", atomicMode, testAtomicCrash},
	{"LeasedClientGone", "In leased mode, when the client hangs up while the handler runs, the handler's outcome is still recorded and a retry replays it.", leased, testLeasedClientGone},
	{"MaxAttempt", "An attempt outlives its client but not MaxAttempt: at the bound its context ends with cause ErrAttemptTimeout; a 5xx before MarkEffect then releases the key and the retry runs.", both, testMaxAttempt},
	{"LeasedClientGoneAfterEffect", "In leased mode the handler's context does not end when the client goes away: the attempt runs to its end, records its 201, and the retry replays it; the handler runs once.", leased, testLeasedClientGoneAfterEffect},
	{"LateBodyReader", "A handler behind http.TimeoutHandler inside the protected route that reads the request body after the timeout answered the client (the engine's Serve has returned), while other requests run, reads its own request's body whole and never another request's bytes.", both, testLateBodyReader},
	{"AtomicClientGone", "In atomic mode, as in leased mode, the handler's context and transaction do not end when the client goes away: the attempt records its 201 and the retry replays it; the handler runs once.", atomicMode, testAtomicClientGone},

	// Leases.
	{"LeasedTakeover", "In leased mode a request meeting a lapsed lease takes the record over and runs (attempt 2, same downstream key); the old attempt's completion is refused and its client gets a 409 lease-lost; duplicates replay the new attempt's answer.", leased, testTakeover},
	{"LeasedTakeoverMismatch", "A request with a different body under a key whose first attempt's lease lapsed is a mismatch (422), not a takeover: the key stays bound to the first request.", leased, testTakeoverMismatch},
	{"LeasedNoTakeover", "With WithoutTakeover() a request meeting a lapsed lease does not run: the record becomes indeterminate and a 500 outcome-unknown problem document is replayed.", leased, testNoTakeover},

	// Retention.
	{"Retention", "A duplicate within the Retention window replays; after it the record is absent and the same key runs the handler again.", both, testRetention},

	// Sealing.
	{"Sealing", "With WithSealer(seal.NewAESGCM) the replay is identical to the first answer and the stored response holds no plaintext of the body.", both, testSealing},

	// Composition.
	{"BodyConsumedUpstream", "A request whose body a middleware before the adapter's read without restoring it gets a 500 body-consumed problem document, never a fingerprint of an empty body, and the handler does not run.", both, testBodyConsumedUpstream},

	// Scope.
	{"ExplicitScope", "Two routes with the same core.Scope name share records: the same key on the second route meets the first route's record, and since the fingerprint covers the path, gets a 422 whatever the body; the second handler never runs.", both, testExplicitScope},
	{"KeyOnAnotherRoute", "Identity is (caller, scope, key) with an empty scope by default: the same key sent to POST /orders and then to POST /orders/1/cancel is a key reused for another request, a 422, and the cancel does not run; with a key of its own it runs.", both, testKeyOnAnotherRoute},
	{"ScopeEmptyByDefault", "Without a Scope option the scope is empty, never the route pattern or the path: requests to /orders/1/refunds and /orders/2/refunds with the same key, caller and body address one record (caller, \"\", key), and the second, whose path differs, gets a 422 from it.", both, testScopeEmptyByDefault},

	// The handler's context.
	{"HandlerContext", "The handler's request context carries the attempt (AttemptFrom: identity, attempt 1, the mode), a downstream key and, in atomic mode, the store's transaction.", both, testHandlerContext},
}

// globalScenarios is the suite RunGlobal runs.
var globalScenarios = []scenario{
	{"ReplaysRecordedAnswer", "A duplicate gets the recorded answer plus Idempotent-Replayed: true, and the handler does not run again.", both, testReplay},
	{"ScopeEmptyByDefault", "Without a Scope option the scope is empty, never the route pattern or the path: requests to /orders/1/refunds and /orders/2/refunds with the same key address one record, and the second gets a 422 from it.", both, testScopeEmptyByDefault},
	{"KeyOnAnotherRoute", "The same key sent to POST /orders and then to POST /orders/1/cancel is a key reused for another request: a 422, and the cancel does not run.", both, testKeyOnAnotherRoute},
	{"DefaultMethods", "Only POST and PATCH are covered by default: GET, PUT and DELETE run every time and are never replayed.", both, testMethodsDefault},
	{"HandlerContext", "The handler's request context carries the attempt, a downstream key and, in atomic mode, the store's transaction.", both, testHandlerContext},
	{"BadKeys", "A covered request without a key or with a malformed one gets a 400 problem document and the handler does not run.", both, testBadKeys},
	{"RouterAnswersUntouched", "Requests the router rejects itself (unknown path: 404; known path, wrong method: 405 with Allow) get the router's answer, with or without a key, on every retry, never a problem document of the middleware, never a replay.", both, testRouterAnswers},
	{"OtherResource", "The same key, caller and body sent to /orders/1/payments and then to /orders/2/payments gets a 422, never order 1's answer.", both, testOtherResource},
	{"OtherQuery", "The same key sent with ?dry_run=true and then ?dry_run=false gets a 422; the query reordered replays.", both, testOtherQuery},
	{"BodyConsumedUpstream", "A request whose body a middleware before the adapter's read without restoring it gets a 500 body-consumed problem document, never a fingerprint of an empty body, and the handler does not run.", both, testBodyConsumedUpstream},
	{"SkippedRoute", "A route the install's skipper leaves out runs every time, with or without a key, is never replayed and reports no decision; the other routes stay protected.", both, testSkippedRoute},
}
