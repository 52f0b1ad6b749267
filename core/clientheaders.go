package core

import (
	"fmt"
	"net/http"
	"strings"
)

// What a client sees of the engine besides status and body: the request
// header it reads the key from, the Link of its problem documents, and the
// response headers a browser client must be allowed to read.

// WithKeyHeader sets the request header that carries the idempotency key
// (default HeaderKey, "Idempotency-Key"), for the clients of an API that
// spells it otherwise ("X-Idempotency-Key"). Only that header is read;
// the key's syntax is the same (raw, or an RFC 8941 quoted string). Every adapter honours it (the
// engine reads the header), and the problem documents name it. The name
// is matched case-insensitively, as every header name is.
func WithKeyHeader(name string) Option {
	return engineOption(func(c *config) error {
		name = strings.TrimSpace(name)
		if name == "" || strings.ContainsAny(name, " \t:\r\n") {
			return fmt.Errorf("%w: WithKeyHeader(%q): not a header name", ErrConfig, name)
		}
		c.keyHeader = http.CanonicalHeaderKey(name)
		return nil
	})
}

// KeyHeader returns the name of the request header the engine reads the
// key from (WithKeyHeader; canonical, as http.Header keys are).
func (e *Engine) KeyHeader() string { return e.keyHeader() }

func (e *Engine) keyHeader() string {
	if e.cfg.keyHeader == "" {
		return HeaderKey
	}
	return e.cfg.keyHeader
}

// keyFrom reads the key from the header named name (canonical: an
// http.Header key) of h: ("", nil) when the header is absent; more than
// one header field is an error wrapping ErrInvalidKey (see parseKey).
func keyFrom(h http.Header, name string) (string, error) {
	vs := h[name]
	switch len(vs) {
	case 0:
		return "", nil
	case 1:
	default:
		return "", clientErrorf(ErrInvalidKey, "the header appears %d times", len(vs))
	}
	return parseKey(vs[0])
}

// namedKeyHeader returns s with the default header name replaced by the
// engine's (WithKeyHeader), for the title and detail of a problem.
func (e *Engine) namedKeyHeader(s string) string {
	if h := e.keyHeader(); h != HeaderKey {
		return strings.ReplaceAll(s, HeaderKey, h)
	}
	return s
}

// WithProblemDocs sets the documentation every problem document links to
// with Link: <url>; rel="describedby" (default DefaultProblemDocs), as the
// IETF Idempotency-Key draft says a server SHOULD for its 400 and 422
// answers (draft-ietf-httpapi-idempotency-key-header, "Error Scenarios"):
// point it at your API's own page on idempotency. "" sends no Link.
func WithProblemDocs(url string) Option {
	return engineOption(func(c *config) error {
		if strings.ContainsAny(url, "<>\r\n") {
			return fmt.Errorf("%w: WithProblemDocs(%q): not a URL", ErrConfig, url)
		}
		c.problemDocs = &url
		return nil
	})
}

func (e *Engine) problemDocs() string {
	if e.cfg.problemDocs == nil {
		return DefaultProblemDocs
	}
	return *e.cfg.problemDocs
}
