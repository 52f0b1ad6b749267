package grpcidem

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"

	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	"github.com/idemkit/idem/core"
)

// Metadata keys.
const (
	// MetadataKey carries the idempotency key (raw or an RFC 8941 quoted
	// string, as the Idempotency-Key header over HTTP).
	MetadataKey = "idempotency-key"
	// MetadataReplayed is sent as a header, "true", with a replayed answer.
	MetadataReplayed = "idempotent-replayed"
)

// UnaryServerInterceptor returns a unary server interceptor that runs every
// unary call (except those WithSkipper leaves out) at most once per
// (caller, scope, key) on e. The key comes from the MetadataKey metadata,
// the caller from the function given WithCaller (or WithSingleCaller), the
// scope is empty unless a core.Scope route option names one: a key is
// unique within its caller, and the same key on another method is a key
// reused for another call (the fingerprint covers the full method name),
// answered FailedPrecondition (KEY_REUSED). The full method name labels
// the decisions (observe.Event.Route). It fails with core.ErrConfig when
// neither WithCaller nor WithSingleCaller is given.
//
//	in, err := grpcidem.UnaryServerInterceptor(e, grpcidem.WithCaller(accountFrom))
//	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(auth, in))
func UnaryServerInterceptor(e *core.Engine, opts ...Option) (grpc.UnaryServerInterceptor, error) {
	if e == nil {
		return nil, fmt.Errorf("%w: grpcidem: nil engine", core.ErrConfig)
	}
	c := config{methods: map[string][]core.RouteOption{}, logger: slog.Default()}
	for _, o := range opts {
		if err := o.apply(&c); err != nil {
			return nil, err
		}
	}
	if c.caller == nil && !c.singleCaller {
		return nil, fmt.Errorf("%w: grpcidem: configure WithCaller, or WithSingleCaller if the service really has one caller (otherwise all callers would share one key space)", core.ErrConfig)
	}
	if c.caller != nil && c.singleCaller {
		return nil, fmt.Errorf("%w: grpcidem: WithCaller and WithSingleCaller exclude each other", core.ErrConfig)
	}
	in := &interceptor{cfg: c, def: e.Route(c.routeOpts...), routes: map[string]*core.Route{}}
	for m, opts := range c.methods {
		in.routes[m] = e.Route(append(append([]core.RouteOption(nil), c.routeOpts...), opts...)...)
	}
	return in.intercept, nil
}

type interceptor struct {
	cfg    config
	def    *core.Route
	routes map[string]*core.Route // by full method name
}

func (in *interceptor) intercept(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if in.cfg.skip != nil && in.cfg.skip(ctx, info.FullMethod) {
		return handler(ctx, req)
	}
	rt := in.routes[info.FullMethod]
	if rt == nil {
		rt = in.def
	}
	md, _ := metadata.FromIncomingContext(ctx)
	var (
		out  any
		herr error
		capt *capture
	)
	resp, replayed, err := rt.Exec(ctx, core.Request{
		Key:         md.Get(MetadataKey),
		Caller:      in.cfg.caller,
		Route:       info.FullMethod,
		Fingerprint: func() ([]byte, error) { return Fingerprint(info.FullMethod, req) },
	}, func(hctx context.Context) *core.Response {
		capt = &capture{}
		out, herr = handler(grpc.NewContextWithServerTransportStream(hctx, &captureStream{capture: capt, method: info.FullMethod}), req)
		return in.encode(&out, &herr, capt)
	})
	switch {
	case err != nil:
		return nil, rejection(err)
	case replayed:
		return in.replay(ctx, info.FullMethod, resp)
	}
	capt.forward(ctx)
	return out, herr
}

// Fingerprint is the fingerprint of a call: SHA-256 over a version tag, the
// full method name (length-prefixed) and the deterministic serialisation
// (proto.MarshalOptions{Deterministic: true}) of the request message. Two
// calls whose messages a handler reads the same (fields sent in another
// order, a map in another order) have the same fingerprint; unknown fields
// count. It fails for a request that is not a protocol buffer message.
func Fingerprint(fullMethod string, req any) ([]byte, error) {
	m, err := message(req)
	if err != nil {
		return nil, err
	}
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	if err != nil {
		return nil, err
	}
	h := sha256.New()
	h.Write([]byte("idem/grpc/v1\x00"))
	var n [8]byte
	binary.BigEndian.PutUint64(n[:], uint64(len(fullMethod)))
	h.Write(n[:])
	h.Write([]byte(fullMethod))
	h.Write(b)
	return h.Sum(nil), nil
}

// message returns v as a protocol buffer message (APIv2, or APIv1 through
// protoadapt).
func message(v any) (proto.Message, error) {
	switch m := v.(type) {
	case proto.Message:
		return m, nil
	case protoadapt.MessageV1:
		return protoadapt.MessageV2Of(m), nil
	}
	return nil, fmt.Errorf("grpcidem: %T is not a protocol buffer message (grpcidem needs the proto codec)", v)
}

// A recorded answer's body is a kind byte and its payload: kindMessage,
// the uvarint length of the response message's full type name, the name,
// then the message's bytes; or kindStatus, then the google.rpc.Status's
// bytes. A body without a kind byte was recorded by the engine itself (a
// panic). The allowlisted metadata are the record's headers, names
// prefixed (the body keeps the kind: a resolver's response passes through
// the engine's HTTP header allowlist).
const (
	kindMessage byte = 'M'
	kindStatus  byte = 'S'
	hdrPfx           = "h:" // a recorded header
	trailPfx         = "t:" // a recorded trailer
)

// messageBody is the recorded body of an answer m.
func messageBody(m proto.Message) ([]byte, error) {
	name := string(m.ProtoReflect().Descriptor().FullName())
	b := append([]byte{kindMessage}, binary.AppendUvarint(nil, uint64(len(name)))...)
	b = append(b, name...)
	return proto.MarshalOptions{}.MarshalAppend(b, m)
}

// encode turns the handler's result into the response to record. A result
// that cannot be recorded (not a protocol buffer message, or none at all)
// becomes an Internal error, in *herr too.
func (in *interceptor) encode(out *any, herr *error, capt *capture) *core.Response {
	h := http.Header{}
	capt.mu.Lock()
	for k, vs := range capt.header {
		if in.cfg.recorded[k] {
			h[hdrPfx+k] = append([]string(nil), vs...)
		}
	}
	for k, vs := range capt.trailer {
		if in.cfg.recorded[k] {
			h[trailPfx+k] = append([]string(nil), vs...)
		}
	}
	capt.mu.Unlock()
	if *herr == nil {
		if *out == nil {
			*herr = status.Error(codes.Internal, "the handler returned neither a response nor an error")
		} else if m, err := message(*out); err != nil {
			*herr = status.Error(codes.Internal, "the response could not be recorded")
			in.cfg.logger.Error("grpcidem: the handler's response cannot be recorded", slog.String("error", err.Error()))
		} else if b, err := messageBody(m); err != nil {
			*herr = status.Error(codes.Internal, "the response could not be recorded")
			in.cfg.logger.Error("grpcidem: the handler's response cannot be recorded", slog.String("error", err.Error()))
		} else {
			return &core.Response{Status: http.StatusOK, Header: h, Body: b}
		}
	}
	st := status.Convert(*herr)
	b, err := proto.MarshalOptions{}.MarshalAppend([]byte{kindStatus}, st.Proto())
	if err != nil {
		b = nil // replayed as an unknown outcome
	}
	return &core.Response{Status: HTTPStatus(st.Code()), Header: h, Body: b}
}

// Response is the record of a successful call answering m, for a
// core.Resolver that settles an indeterminate gRPC call as applied
// (core.Resolution{Outcome: core.OutcomeApplied, Response: r}): duplicates then
// get m, as if the handler had returned it.
func Response(m proto.Message) (*core.Response, error) {
	b, err := messageBody(m)
	if err != nil {
		return nil, err
	}
	return &core.Response{Status: http.StatusOK, Body: b, BodyKept: true}, nil
}

// replay answers with a recorded response.
func (in *interceptor) replay(ctx context.Context, method string, resp *core.Response) (any, error) {
	hdr, trl := metadata.Pairs(MetadataReplayed, "true"), metadata.MD{}
	for name, vs := range resp.Header {
		if k, ok := strings.CutPrefix(name, hdrPfx); ok {
			hdr[k] = append(hdr[k], vs...)
		} else if k, ok := strings.CutPrefix(name, trailPfx); ok {
			trl[k] = append(trl[k], vs...)
		}
	}
	_ = grpc.SetHeader(ctx, hdr)
	_ = grpc.SetTrailer(ctx, trl)
	if !resp.BodyKept {
		return nil, rejection(core.ErrNotKept)
	}
	var kind byte
	body := resp.Body
	if len(body) > 0 {
		kind, body = body[0], body[1:]
	}
	switch kind {
	case kindMessage:
		n, k := binary.Uvarint(body)
		if k <= 0 || n > uint64(len(body)-k) {
			return nil, status.Error(codes.Internal, "the recorded response could not be replayed")
		}
		name, payload := string(body[k:k+int(n)]), body[k+int(n):]
		mt, err := protoregistry.GlobalTypes.FindMessageByName(protoreflect.FullName(name))
		if err != nil {
			in.cfg.logger.Error("grpcidem: the recorded response's type is not registered; it cannot be replayed", slog.String("method", method), slog.String("type", name), slog.String("error", err.Error()))
			return nil, status.Error(codes.Internal, "the recorded response could not be replayed")
		}
		m := mt.New().Interface()
		if err := proto.Unmarshal(payload, m); err != nil {
			in.cfg.logger.Error("grpcidem: the recorded response does not decode", slog.String("method", method), slog.String("type", name), slog.String("error", err.Error()))
			return nil, status.Error(codes.Internal, "the recorded response could not be replayed")
		}
		return m, nil
	case kindStatus:
		st := new(spb.Status)
		if err := proto.Unmarshal(body, st); err != nil {
			return nil, status.Error(codes.Internal, "the recorded response could not be replayed")
		}
		return nil, status.ErrorProto(st)
	}
	// Recorded by the engine, not by the handler: a panic after MarkEffect
	// (indeterminate).
	return nil, rejection(core.ErrIndeterminate)
}

// capture holds what the handler set with grpc.SetHeader, SendHeader and
// SetTrailer: nothing reaches the client before the outcome is recorded
// (in atomic mode: committed). Then the interceptor sets all of it (not
// only the recorded keys) on the call's own stream.
type capture struct {
	mu      sync.Mutex
	header  metadata.MD
	trailer metadata.MD
	sent    bool // SendHeader was called
}

// forward sets the captured metadata on the call's stream in ctx.
func (c *capture) forward(ctx context.Context) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.header) > 0 {
		_ = grpc.SetHeader(ctx, c.header)
	}
	if len(c.trailer) > 0 {
		_ = grpc.SetTrailer(ctx, c.trailer)
	}
}

// captureStream is the grpc.ServerTransportStream the handler sees.
type captureStream struct {
	*capture
	method string
}

func (s *captureStream) Method() string { return s.method }

func (s *captureStream) SetHeader(md metadata.MD) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.sent {
		return status.Error(codes.Internal, "grpc: SetHeader called after SendHeader")
	}
	s.header = metadata.Join(s.header, lower(md))
	return nil
}

func (s *captureStream) SendHeader(md metadata.MD) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.sent {
		return status.Error(codes.Internal, "grpc: SendHeader called more than once")
	}
	s.header = metadata.Join(s.header, lower(md))
	s.sent = true
	return nil
}

func (s *captureStream) SetTrailer(md metadata.MD) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.trailer = metadata.Join(s.trailer, lower(md))
	return nil
}

// lower returns md with lowercase keys (metadata.MD built by hand may have
// others; the transport lowercases them too).
func lower(md metadata.MD) metadata.MD {
	out := make(metadata.MD, len(md))
	for k, vs := range md {
		k = strings.ToLower(k)
		out[k] = append(out[k], vs...)
	}
	return out
}
