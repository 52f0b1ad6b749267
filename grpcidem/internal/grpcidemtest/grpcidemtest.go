// Package grpcidemtest serves a test service through grpcidem on a real
// grpc.Server over an in-memory listener (bufconn), for the tests of
// grpcidem and of its use with the SQL stores (grpcidem/sqltest). Requests
// and responses are structpb.Struct with hand-written service descriptors,
// so no generated code is needed. It is internal: a harness of idem's own
// tests, not part of grpcidem's API.
package grpcidemtest

import (
	"context"
	"fmt"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/grpcidem"
)

// Methods of the test service.
const (
	Create = "/test.Orders/Create"
	Other  = "/test.Orders/Other"
	Get    = "/test.Orders/Get"
)

// Handler is what the test service runs for every method.
type Handler func(ctx context.Context, method string, req *structpb.Struct) (*structpb.Struct, error)

// AccountKey is the metadata key that names the caller (CallerFromMetadata).
const AccountKey = "x-account"

// CallerFromMetadata is a grpcidem caller function: the AccountKey
// metadata, or "" (refused) when it is not sent once.
func CallerFromMetadata(ctx context.Context) (string, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	if v := md.Get(AccountKey); len(v) == 1 {
		return v[0], nil
	}
	return "", nil
}

// Server is the test service served with the interceptor, and a client
// connection to it.
type Server struct {
	// Runs counts the handler's executions.
	Runs   atomic.Int64
	handle Handler
	conn   *grpc.ClientConn
}

func unary(full string) func(srv any, ctx context.Context, dec func(any) error, ic grpc.UnaryServerInterceptor) (any, error) {
	return func(srv any, ctx context.Context, dec func(any) error, ic grpc.UnaryServerInterceptor) (any, error) {
		in := new(structpb.Struct)
		if err := dec(in); err != nil {
			return nil, err
		}
		s := srv.(*Server)
		h := func(ctx context.Context, req any) (any, error) {
			s.Runs.Add(1)
			return s.handle(ctx, full, req.(*structpb.Struct))
		}
		if ic == nil {
			return h(ctx, in)
		}
		return ic(ctx, in, &grpc.UnaryServerInfo{Server: srv, FullMethod: full}, h)
	}
}

var serviceDesc = grpc.ServiceDesc{
	ServiceName: "test.Orders",
	HandlerType: (*any)(nil),
	Methods: []grpc.MethodDesc{
		{MethodName: "Create", Handler: unary(Create)},
		{MethodName: "Other", Handler: unary(Other)},
		{MethodName: "Get", Handler: unary(Get)},
	},
}

// New serves h through grpcidem's interceptor over e, with
// grpcidem.WithCaller(CallerFromMetadata) and opts, after the outer
// interceptors, on a real grpc.Server; both stop at the test's cleanup.
func New(t testing.TB, e *core.Engine, h Handler, opts []grpcidem.Option, outer ...grpc.UnaryServerInterceptor) *Server {
	t.Helper()
	in, err := grpcidem.UnaryServerInterceptor(e, append([]grpcidem.Option{grpcidem.WithCaller(CallerFromMetadata)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{handle: h}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(append(outer, in)...))
	srv.RegisterService(&serviceDesc, s)
	lis := bufconn.Listen(1 << 20)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	s.conn, err = grpc.NewClient("passthrough:///bufnet",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.conn.Close() })
	return s
}

// Reply is what a client received.
type Reply struct {
	Resp     *structpb.Struct
	Header   metadata.MD
	Trailer  metadata.MD
	Err      error
	Replayed bool // the idempotent-replayed header was "true"
}

// Code is the reply's gRPC code.
func (r Reply) Code() codes.Code { return status.Code(r.Err) }

// Reason is the reply's errdetails.ErrorInfo reason and RetryInfo delay.
func (r Reply) Reason() (string, time.Duration) {
	var reason string
	var delay time.Duration
	for _, x := range status.Convert(r.Err).Details() {
		switch x := x.(type) {
		case *errdetails.ErrorInfo:
			reason = x.Reason
		case *errdetails.RetryInfo:
			delay = x.RetryDelay.AsDuration()
		}
	}
	return reason, delay
}

func (r Reply) String() string {
	if r.Err != nil {
		return fmt.Sprintf("error %v (replayed %v)", r.Err, r.Replayed)
	}
	return fmt.Sprintf("%v (replayed %v)", r.Resp.AsMap(), r.Replayed)
}

// Call invokes method with key ("" for none) as account ("" for none).
func (s *Server) Call(ctx context.Context, method, account, key string, req map[string]any) Reply {
	md := metadata.MD{}
	if key != "" {
		md.Set(grpcidem.MetadataKey, key)
	}
	if account != "" {
		md.Set(AccountKey, account)
	}
	return s.CallMD(ctx, method, md, req)
}

// CallMD invokes method with the outgoing metadata md.
func (s *Server) CallMD(ctx context.Context, method string, md metadata.MD, req map[string]any) Reply {
	in, err := structpb.NewStruct(req)
	if err != nil {
		return Reply{Err: err}
	}
	r := Reply{Resp: new(structpb.Struct)}
	r.Err = s.conn.Invoke(metadata.NewOutgoingContext(ctx, md), method, in, r.Resp, grpc.Header(&r.Header), grpc.Trailer(&r.Trailer))
	v := r.Header.Get(grpcidem.MetadataReplayed)
	r.Replayed = len(v) == 1 && v[0] == "true"
	return r
}
