package core

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/http"

	"github.com/idemkit/idem/core/store"
)

// RecordedRequest is the request a record settles, as a route with
// RecordRequest recorded it: what a resolver needs to finish the work
// (write the missing payment row) and what a Finish function runs again.
type RecordedRequest struct {
	Method string
	// Path is the request's path with its query, as sent
	// (http.Request.RequestURI's form: "/orders?x=1").
	Path string
	// Caller is who sent it (the answer of the engine's WithCaller function; "" with
	// WithSingleCaller).
	Caller string
	// Body is the request's body, or what RecordRequest's function chose
	// from it.
	Body []byte
}

// resolvingKey carries the RecordedRequest a resolver settles.
type resolvingKey struct{}

// ResolvingRequest returns the request that the record a resolver (or a
// Finish function) is settling belongs to: from a Completer, the request
// recorded with the record (RecordRequest); on a client's duplicate, that
// duplicate's own request (its fingerprint matched the record's). It
// reports false outside a resolver, and for a route without
// RecordRequest.
func ResolvingRequest(ctx context.Context) (RecordedRequest, bool) {
	r, ok := ctx.Value(resolvingKey{}).(*RecordedRequest)
	if !ok || r == nil {
		return RecordedRequest{}, false
	}
	return *r, true
}

// encRequest is the first byte of an encoded RecordedRequest (a response's
// encoding starts otherwise, a sealed one with encSealed).
const encRequest = 'Q'

// encodeRequest appends the encoding of r to dst: encRequest, then the
// method, path, caller and body, each length-prefixed (uvarint).
func encodeRequest(dst []byte, r *RecordedRequest) []byte {
	dst = append(dst, encRequest)
	for _, s := range [...]string{r.Method, r.Path, r.Caller} {
		dst = binary.AppendUvarint(dst, uint64(len(s)))
		dst = append(dst, s...)
	}
	dst = binary.AppendUvarint(dst, uint64(len(r.Body)))
	return append(dst, r.Body...)
}

var errBadRequestEncoding = errors.New("idem: the recorded request does not decode")

// decodeRequest reverses encodeRequest.
func decodeRequest(b []byte) (*RecordedRequest, error) {
	if len(b) == 0 || b[0] != encRequest {
		return nil, errBadRequestEncoding
	}
	b = b[1:]
	var parts [4][]byte
	for i := range parts {
		n, k := binary.Uvarint(b)
		if k <= 0 || n > uint64(len(b)-k) {
			return nil, errBadRequestEncoding
		}
		parts[i], b = b[k:k+int(n)], b[k+int(n):]
	}
	if len(b) != 0 {
		return nil, errBadRequestEncoding
	}
	return &RecordedRequest{Method: string(parts[0]), Path: string(parts[1]), Caller: string(parts[2]),
		Body: append([]byte(nil), parts[3]...)}, nil
}

// sealRequest encodes r and seals it for record id with the engine's
// Sealer, if any.
func (e *Engine) sealRequest(id store.ID, r *RecordedRequest) ([]byte, error) {
	plain := encodeRequest(make([]byte, 0, 16+len(r.Method)+len(r.Path)+len(r.Caller)+len(r.Body)), r)
	if e.cfg.sealer == nil {
		return plain, nil
	}
	sealed, err := e.cfg.sealer.Seal(id, plain)
	if err != nil {
		return nil, fmt.Errorf("idem: sealing the recorded request: %w", err)
	}
	return sealed, nil
}

// openRequest reverses sealRequest.
func (e *Engine) openRequest(id store.ID, b []byte) (*RecordedRequest, error) {
	if len(b) > 0 && b[0] == encSealed {
		if e.cfg.sealer == nil {
			return nil, errors.New("idem: the recorded request is sealed and no sealer is configured")
		}
		plain, err := e.cfg.sealer.Open(id, b)
		if err != nil {
			return nil, fmt.Errorf("idem: opening the recorded request: %w", err)
		}
		b = plain
	}
	return decodeRequest(b)
}

// recordRequest builds what the route records of r (RecordRequest), or
// nil when it records nothing.
func (rt *Route) recordRequest(r *http.Request, caller string, body []byte) (*RecordedRequest, error) {
	if rt.p.record == nil {
		return nil, nil
	}
	if f := *rt.p.record; f != nil {
		var err error
		if body, err = f(body); err != nil {
			return nil, err
		}
	}
	return &RecordedRequest{Method: r.Method, Path: r.URL.RequestURI(), Caller: caller, Body: append([]byte(nil), body...)}, nil
}
