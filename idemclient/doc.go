// Package idemclient is the client half of the Idempotency-Key protocol: an
// http.RoundTripper that gives every non-safe request a key and retries it,
// with the same key and the same body, when the answer was lost or the
// server asked to be asked again.
//
//	c, err := idemclient.NewClient()            // or NewTransport(base, ...) under your own http.Client
//	resp, err := c.Post(url, "application/json", bytes.NewReader(body))
//	if err != nil {
//		var e *idemclient.Error                 // the key survives a failure:
//		if errors.As(err, &e) { saveForLater(e.Key) } // retry later with it, never with a new one
//	}
//	idemclient.Replayed(resp) // the server answered with its record of an earlier attempt
//	idemclient.Key(resp)      // the Idempotency-Key every attempt carried
//	idemclient.Attempts(resp) // how many attempts it took
//
// # Which requests
//
// Requests whose method is not GET, HEAD, OPTIONS or TRACE (POST, PATCH, PUT,
// DELETE and any other) are sent with an Idempotency-Key: the caller's own,
// when the request has one, or else a fresh random one (NewKey, a UUID v4).
// Safe methods pass through untouched, once.
//
// # When it retries
//
// Every attempt of one request carries the same key and the same body. A
// request is sent again, after a wait, when
//
//   - no response came: a network error (connection refused or reset, the
//     connection closed before the answer), or no response headers within
//     WithAttemptTimeout;
//   - 409 with Retry-After: the same key is still being processed
//     (in-progress, lease-lost);
//   - 503 with Retry-After: the server's store or transaction failed and
//     nothing was committed (store-unavailable, transaction-aborted);
//   - 502 or 504: a gateway between client and server lost the answer,
//     which is a network error one hop further.
//
// A replayed answer (Idempotent-Replayed: true) is never retried, whatever
// its status: it is the server's record of an earlier attempt (a 502 or
// 504 the handler answered after it started an effect, a 409 of its own),
// not a lost answer, and every retry would get it again.
//
// Nothing else is retried: not a 400, 422 or any other 4xx (a retry sends
// the same request and gets the same answer), not a 409 or 503 without
// Retry-After (the handler's own answer, not the idempotency layer's), and
// not a 500 (the server's final answer: a handler that failed, or the
// recorded outcome-unknown of an attempt that may have taken effect, which
// the server replays until it is settled; retrying within seconds changes
// nothing). Those responses are returned as they are.
//
// The wait is the server's Retry-After (seconds or an HTTP date) when it
// sent one, or else capped exponential backoff with full jitter
// (WithBackoff); a Retry-After of no wait (0, a date in the past) waits the
// backoff too, so that a server that keeps saying "now" is not hammered.
//
// The budget is time, not a count of attempts: retries end when the next
// attempt would start more than WithMaxElapsed (1 minute) after the first,
// and when the request's context ends; a wait that would run past either
// bound is not started, and the last answer is returned at once. Attempts
// are not counted unless WithMaxAttempts is given. The default outlasts an
// idem server's default lease (30 s): after a crash on a leased route the
// retries get 409 with Retry-After until the dead attempt's lease lapses
// (the server says when), then the answer of the attempt that takes the
// key over; a service that restarts within a few seconds (connections
// refused meanwhile) is retried through its restart. WithOnRetry reports
// each retry, for a log line or a metric.
//
// # Bodies
//
// A request body is sent again through Request.GetBody (set by
// http.NewRequest for bytes, strings and their readers). A body without
// GetBody is read into memory up to WithMaxBufferedBody (1 MiB); a longer
// one is sent once, without retries.
//
// # Errors
//
// A failure after the last attempt is an *Error carrying the key, so the
// caller can retry the same operation later with it. An http.Client wraps it
// in a *url.Error; errors.As finds it.
package idemclient
