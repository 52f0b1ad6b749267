package idemclient

import (
	"fmt"
	"net/http"
	"time"
)

// Defaults of the options. A Transport's budget for one request is time
// (DefaultMaxElapsed), not a count of attempts: it does not count them
// unless WithMaxAttempts is given.
const (
	// DefaultMaxElapsed is twice idem's default lease (core.DefaultLease,
	// 30 s): after a crash on a leased route a retry gets 409 until the
	// dead attempt's lease lapses, then takes it over, and the client may
	// first have spent DefaultAttemptTimeout on an attempt that never
	// answered.
	DefaultMaxElapsed      = time.Minute      // no attempt starts later than this after the first
	DefaultAttemptTimeout  = 30 * time.Second // wait for one attempt's response headers
	DefaultBackoffBase     = 250 * time.Millisecond
	DefaultBackoffMax      = 10 * time.Second
	DefaultMaxBufferedBody = 1 << 20 // bytes of a body without GetBody kept to send again
)

// DefaultMaxAttempts was the default of WithMaxAttempts.
//
// Deprecated: a Transport no longer counts attempts by default; it retries
// within WithMaxElapsed (DefaultMaxElapsed), so that a key that is busy
// for a whole lease, with a Retry-After of 1 s, is retried until its
// answer: 5 attempts ran out after 4 s. The constant keeps its value, so
// WithMaxAttempts(DefaultMaxAttempts) keeps the old bound.
const DefaultMaxAttempts = 5

// Option configures a Transport.
type Option interface{ apply(*config) error }

type option func(*config) error

func (f option) apply(c *config) error { return f(c) }

type config struct {
	maxAttempts     int // 0: not counted
	maxElapsed      time.Duration
	attemptTimeout  time.Duration
	backoffBase     time.Duration
	backoffMax      time.Duration
	maxBufferedBody int64
	onRetry         func(Retry)
}

func defaults() config {
	return config{
		maxElapsed:      DefaultMaxElapsed,
		attemptTimeout:  DefaultAttemptTimeout,
		backoffBase:     DefaultBackoffBase,
		backoffMax:      DefaultBackoffMax,
		maxBufferedBody: DefaultMaxBufferedBody,
	}
}

// WithMaxAttempts bounds the attempts of one request, the first included
// (default: no bound; WithMaxElapsed is the budget). 1 sends every request
// once: a key, no retries. A bound above 1 can end the retries before an
// idem server's lease lapses (30 s by default, answered meanwhile with 409
// and Retry-After), and then the answer of the attempt that takes it over
// is never seen: bound the time instead.
func WithMaxAttempts(n int) Option {
	return option(func(c *config) error {
		if n < 1 {
			return fmt.Errorf("idemclient: WithMaxAttempts(%d): at least 1 (1 sends once, without retries)", n)
		}
		c.maxAttempts = n
		return nil
	})
}

// WithMaxElapsed bounds the time over which one request is retried (default
// DefaultMaxElapsed, 1 minute, twice idem's default lease): no attempt
// starts, and no wait ends, later than d after the first attempt started.
// It is the retries' budget: against an idem server keep it above the
// server's lease (core.WithLease), or a retry after a crash gives up
// before the lease lapses and the key can be taken over. An attempt under way is bounded by
// WithAttemptTimeout and the request's context, so the whole call may last
// up to d plus one attempt.
func WithMaxElapsed(d time.Duration) Option {
	return option(func(c *config) error {
		if d <= 0 {
			return fmt.Errorf("idemclient: WithMaxElapsed(%s): must be positive", d)
		}
		c.maxElapsed = d
		return nil
	})
}

// WithAttemptTimeout bounds one attempt from its start (sending the request
// included) to its response headers (default DefaultAttemptTimeout, 30
// seconds). An attempt without headers by
// then is abandoned and retried with the same key: on an idem server the
// abandoned attempt runs to its end, and the retry gets 409 while it runs,
// then its answer. The body of the response that came is not bounded (use
// the request's context). 0 leaves attempts unbounded: only the request's
// context ends them.
func WithAttemptTimeout(d time.Duration) Option {
	return option(func(c *config) error {
		if d < 0 {
			return fmt.Errorf("idemclient: WithAttemptTimeout(%s): 0 (no bound) or positive", d)
		}
		c.attemptTimeout = d
		return nil
	})
}

// WithBackoff sets the wait before a retry when the server sent no
// Retry-After, or one of no wait (0, or a date in the past): a random
// duration between 0 and min(max, base·2^(n-1)) before the n-th retry
// ("full jitter"). Defaults DefaultBackoffBase (250 ms) and
// DefaultBackoffMax (10 s). A positive Retry-After is honoured as sent,
// whatever max says, as long as it ends within WithMaxElapsed and the
// request's context.
func WithBackoff(base, max time.Duration) Option {
	return option(func(c *config) error {
		if base <= 0 || max < base {
			return fmt.Errorf("idemclient: WithBackoff(%s, %s): base must be positive and max at least base", base, max)
		}
		c.backoffBase, c.backoffMax = base, max
		return nil
	})
}

// WithMaxBufferedBody bounds the bytes kept in memory to send again a
// request body that has no GetBody (default DefaultMaxBufferedBody, 1 MiB).
// A longer body is sent once, without retries; so is every such body with
// n = 0. Bodies with GetBody (bytes.Reader, bytes.Buffer, strings.Reader
// given to http.NewRequest) are never buffered.
func WithMaxBufferedBody(n int64) Option {
	return option(func(c *config) error {
		if n < 0 {
			return fmt.Errorf("idemclient: WithMaxBufferedBody(%d): 0 (never buffer) or positive", n)
		}
		c.maxBufferedBody = n
		return nil
	})
}

// Retry describes a retry that is about to happen (WithOnRetry).
type Retry struct {
	Request *http.Request // the caller's request: read it, do not modify it
	Key     string        // the key every attempt carries
	Attempt int           // the attempt that was not the answer (1: the first)
	Status  int           // its response's status; 0 when it had none
	Err     error         // its error when it had no response
	Wait    time.Duration // the wait before the next attempt
}

// WithOnRetry calls f before each wait for another attempt (default: none),
// for a log line or a metric: a client that retries for a minute without a
// trace is hard to operate. f runs on the request's goroutine; keep it fast.
func WithOnRetry(f func(Retry)) Option {
	return option(func(c *config) error {
		c.onRetry = f
		return nil
	})
}
