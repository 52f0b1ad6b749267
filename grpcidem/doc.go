// Package grpcidem is idem for gRPC servers: a unary server interceptor
// that runs each call at most once per (caller, scope, key) and answers
// retries with the first answer.
//
// The key comes from the idempotency-key metadata (MetadataKey), the caller
// from a function over the call's context (WithCaller, or WithSingleCaller),
// the scope is empty unless a core.Scope route option names one (as over
// HTTP: a key is unique within its caller, whatever the method), and the
// fingerprint is the deterministic serialisation of the request message
// with the full method name (Fingerprint), so the same key on another
// method is a key reused (KEY_REUSED). The full method name labels the
// decisions (observe.Event.Route). The interceptor runs the call through the engine's state
// machine (core.Route.Exec) with the same rules as an HTTP request: the
// handler's gRPC code decides the record as its HTTP equivalent does
// (HTTPStatus), rejections are gRPC status errors with an
// errdetails.ErrorInfo (and an errdetails.RetryInfo when a retry with the
// same key will get an answer), and a replay returns the recorded message
// or status with the allowlisted header and trailer metadata
// (WithRecordedMetadata) and idempotent-replayed: true.
//
// With a SQL store (sqlstore, gormstore, pgxstore) calls run in atomic
// mode: the handler writes through the transaction its context carries
// (sqlstore.Tx(ctx), gormstore.DB(ctx), pgxstore.Tx(ctx)), which commits
// with the record before the client gets the answer.
//
// Response messages are replayed as their registered Go type
// (protoregistry.GlobalTypes, where generated code registers itself), so
// the response types must be generated (or well-known) messages.
package grpcidem
