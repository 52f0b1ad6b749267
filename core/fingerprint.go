package core

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"hash"
	"maps"
	"mime"
	"net/http"
	"net/url"
	"slices"
	"strings"

	"github.com/idemkit/idem/internal/canonjson"
)

// Fingerprinter computes the fingerprint of a request for scope (the
// route's Scope name, "" by default). body is the full request body (already
// read; a Fingerprinter must not read r.Body). Returning (nil, nil) means "no
// fingerprint": a record without a fingerprint cannot be contradicted.
//
// A configured Fingerprinter replaces DefaultFingerprint entirely: what it
// leaves out (the method, the path, the query, parts of the body) is what
// two requests under one key may differ in and still replay each other;
// with the scope empty by default, a Fingerprinter without the method and
// the path lets a key replay across routes.
type Fingerprinter func(r *http.Request, scope string, body []byte) ([]byte, error)

// DefaultFingerprint is the Fingerprinter used when none is configured. It
// covers the whole request as the handler sees it, and returns the SHA-256
// (32 bytes) of:
//
//	"idem/fp/v2\n"
//	part(scope) part(method) part(URL.Path) part(URL.RawPath)
//	a one-byte query kind, part(query form)
//	for an empty body: 'e'
//	otherwise: n, part(ct₁) … part(ctₙ), a one-byte body kind, the body in the form of that kind
//
// where part(s) is len(s) as 8 bytes big endian followed by s, so no two
// different requests run together into the same bytes (the body, last, needs
// no length). The method is Request.Method; the path is the path as the
// client sent it: the decoded URL.Path and URL.RawPath, the escaped form
// net/http keeps when the client's escaping is not the default one (so
// "/a%2Fb" and "/a/b" differ, and so does every path a router could read
// differently). The query kind and form:
//
//   - 'q' and url.Values.Encode of url.ParseQuery(URL.RawQuery): parameters
//     sorted by name, the values of one name in the order they came, each
//     decoded and escaped again; an empty query is 'q' and nothing;
//   - 'r' and URL.RawQuery when url.ParseQuery fails (a semicolon, a bad
//     escape).
//
// A body comes with the Content-Type it was sent with: n (8 bytes big
// endian) is the number of Content-Type field values, ct₁ … ctₙ the values
// as sent (net/http trims the whitespace around a field value), byte for
// byte. Its parameters count, because a multipart boundary or a charset
// changes what the handler reads; so do the case of the media type and
// the spelling of the parameters, because handlers compare them as text
// (Echo's and Gin's binders match "application/json" case-sensitively, so
// "Application/JSON" is a 415 there). A retry resends the same header, so
// nothing a client does on purpose is lost. An empty body has no
// Content-Type part: a request without a body has one fingerprint whatever
// Content-Type it declares (and the one it had before the Content-Type
// counted: v2's body-less preimages are unchanged, while every preimage of
// a body starts its body part with n's zero byte, which no earlier v2
// preimage had there).
//
// The body kind and form follow the media type of the Content-Type header
// (parsed with mime.ParseMediaType, so case and parameters do not matter
// to the kind):
//
//   - 'e' and nothing for an empty body, whatever its type;
//   - 'j' and the canonical JSON (docs/contract.md section 2: members
//     sorted, insignificant whitespace removed, strings unescaped,
//     numbers by their literal text) for application/json and any type
//     with the +json suffix; when the body cannot be canonicalised
//     (invalid JSON, too deep, ...), 'r' and the raw bytes instead;
//   - 'f' and the canonical form for application/x-www-form-urlencoded:
//     fields sorted by name, the values of one field in the order they came
//     (it can be meaningful), each name and value decoded and escaped again
//     by url.Values.Encode; 'r' and the raw bytes when url.ParseQuery fails;
//   - 'r' and the raw bytes for anything else (multipart, text, no type).
//
// The scope (the route's Scope name, "" by default) is covered as well, so one key on two routes
// that share an explicit Scope never replays across them with a different
// path. A nil r counts as a request without a method, path, query or
// Content-Type (n = 0). It never returns an error, and it does not retain
// body. Its working memory is bounded by a small multiple of the body
// (TestFingerprintMemory), never the canonical body itself: that is hashed as it
// is written.
func DefaultFingerprint(r *http.Request, scope string, body []byte) ([]byte, error) {
	return fingerprint(new(scratch), make([]byte, 0, sha256.Size), r, scope, body, nil), nil
}

// FingerprintFields returns a Fingerprinter that works like
// DefaultFingerprint (method, path, query and Content-Type included) on a
// body narrowed to the named top-level fields. For a JSON body: the
// canonical form of the top-level object with only the members whose names
// match one of fields as encoding/json matches names to struct fields,
// case-insensitively (so "amount" keeps "Amount" and "AMOUNT" too: a
// handler decoding into a struct reads them); a missing member differs
// from a member that is null, and members whose names collide keep their
// order. For a form body, only the fields named
// exactly. A JSON body whose top level is not an object, or that cannot be
// canonicalised, is hashed as raw bytes, like DefaultFingerprint does; so
// is any other body. With no fields, every JSON object (and every form)
// with one Content-Type has the same fingerprint.
func FingerprintFields(fields ...string) Fingerprinter {
	sel := append([]string{}, fields...) // not nil: the body is narrowed
	return func(r *http.Request, scope string, body []byte) ([]byte, error) {
		return fingerprint(new(scratch), make([]byte, 0, sha256.Size), r, scope, body, sel), nil
	}
}

const fingerprintDomain = "idem/fp/v2\n"

// Kind tags of the fingerprint preimage.
const (
	fpEmpty = 'e'
	fpJSON  = 'j'
	fpForm  = 'f'
	fpQuery = 'q'
	fpRaw   = 'r'
)

type mediaKind int

const (
	mediaOther mediaKind = iota
	mediaJSON
	mediaForm
)

func mediaKindOf(r *http.Request) mediaKind {
	if r == nil {
		return mediaOther
	}
	ct := r.Header.Get("Content-Type")
	switch ct {
	case "":
		return mediaOther
	case "application/json", "application/json; charset=utf-8", "application/json;charset=utf-8":
		return mediaJSON // the common spellings, without ParseMediaType's map
	case "application/x-www-form-urlencoded":
		return mediaForm
	}
	mt, _, err := mime.ParseMediaType(ct)
	if err != nil && !errors.Is(err, mime.ErrInvalidMediaParameter) {
		return mediaOther
	}
	if mt == "application/x-www-form-urlencoded" {
		return mediaForm
	}
	if _, sub, ok := strings.Cut(mt, "/"); ok && (mt == "application/json" || len(sub) > len("+json") && strings.HasSuffix(sub, "+json")) {
		return mediaJSON
	}
	return mediaOther
}

// appendPart appends s with its length in front.
func appendPart(dst []byte, s string) []byte {
	dst = binary.BigEndian.AppendUint64(dst, uint64(len(s)))
	return append(dst, s...)
}

// fingerprint implements DefaultFingerprint (sel == nil) and
// FingerprintFields (sel lists the fields kept), in the working memory s,
// and appends the fingerprint to dst.
func fingerprint(s *scratch, dst []byte, r *http.Request, scope string, body []byte, sel []string) []byte {
	s.h = sha256.New()
	s.buf = appendRequest(s.buf0[:0], r, scope)
	s.h.Write(s.buf)
	s.writeBody(r, body, sel)
	return s.h.Sum(dst)
}

// appendRequest appends the preimage's domain and its framed scope, method,
// path and query (see DefaultFingerprint).
func appendRequest(dst []byte, r *http.Request, scope string) []byte {
	var method, path, rawPath, query string
	if r != nil {
		method = r.Method
		if r.URL != nil {
			path, rawPath, query = r.URL.Path, r.URL.RawPath, r.URL.RawQuery
		}
	}
	qkind := byte(fpQuery)
	if query != "" {
		if vs, err := url.ParseQuery(query); err != nil {
			qkind = fpRaw
		} else {
			query = vs.Encode()
		}
	}
	dst = append(dst, fingerprintDomain...)
	dst = appendPart(dst, scope)
	dst = appendPart(dst, method)
	dst = appendPart(dst, path)
	dst = appendPart(dst, rawPath)
	dst = append(dst, qkind)
	return appendPart(dst, query)
}

// writeBody writes the body's kind and form to s.h (see DefaultFingerprint).
func (s *scratch) writeBody(r *http.Request, body []byte, sel []string) {
	tag := func(kind byte) {
		s.buf = append(s.buf[:0], kind)
		s.h.Write(s.buf)
	}
	if len(body) == 0 {
		tag(fpEmpty)
		return
	}
	s.buf = appendContentType(s.buf[:0], r)
	s.h.Write(s.buf)
	switch mediaKindOf(r) {
	case mediaJSON:
		s.buf = append(s.buf[:0], fpJSON)
		if s.json.Hash(s.h, s.buf, body, sel) {
			return
		}
	case mediaForm:
		if vs, err := url.ParseQuery(string(body)); err == nil {
			if sel != nil {
				maps.DeleteFunc(vs, func(k string, _ []string) bool { return !slices.Contains(sel, k) })
			}
			s.buf = append(append(s.buf[:0], fpForm), vs.Encode()...)
			s.h.Write(s.buf)
			return
		}
	}
	tag(fpRaw)
	s.h.Write(body)
}

// appendContentType appends the Content-Type part of a body's preimage:
// the number of Content-Type field values as 8 bytes big endian, then
// each value framed by appendPart, as sent.
func appendContentType(dst []byte, r *http.Request) []byte {
	var cts []string
	if r != nil {
		cts = r.Header.Values("Content-Type")
	}
	dst = binary.BigEndian.AppendUint64(dst, uint64(len(cts)))
	for _, ct := range cts {
		dst = appendPart(dst, ct)
	}
	return dst
}

// scratch is the working memory of the fingerprinters: the hash, the
// bytes written to it next and the JSON canonicaliser's. The engine's
// per-request state holds one (call.scratch), so that fingerprinting a
// small request allocates only the hash.
type scratch struct {
	h    hash.Hash
	buf  []byte // the preimage's request parts, or a form
	buf0 [128]byte
	json canonjson.Hasher
}
