package grpcidem_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
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
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/memstore"
	"github.com/idemkit/idem/grpcidem"
)

// Methods of the test service (hand-written descriptors: requests and
// responses are structpb.Struct, so no generated code is needed).
const (
	create = "/test.Orders/Create"
	other  = "/test.Orders/Other"
	get    = "/test.Orders/Get"
)

// Handler is what the test service runs for every method.
type Handler func(ctx context.Context, method string, req *structpb.Struct) (*structpb.Struct, error)

type service struct {
	runs   atomic.Int64
	handle atomic.Pointer[Handler]
}

func unary(full string) func(srv any, ctx context.Context, dec func(any) error, ic grpc.UnaryServerInterceptor) (any, error) {
	return func(srv any, ctx context.Context, dec func(any) error, ic grpc.UnaryServerInterceptor) (any, error) {
		in := new(structpb.Struct)
		if err := dec(in); err != nil {
			return nil, err
		}
		s := srv.(*service)
		h := func(ctx context.Context, req any) (any, error) {
			s.runs.Add(1)
			return (*s.handle.Load())(ctx, full, req.(*structpb.Struct))
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
		{MethodName: "Create", Handler: unary(create)},
		{MethodName: "Other", Handler: unary(other)},
		{MethodName: "Get", Handler: unary(get)},
	},
}

// harness is a real grpc.Server on an in-memory listener (bufconn) with the
// interceptor installed, and a client connection to it.
type harness struct {
	svc  *service
	conn *grpc.ClientConn
}

// accountKey carries the caller in the tests' incoming metadata.
const accountKey = "x-account"

func callerFromMetadata(ctx context.Context) (string, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	if v := md.Get(accountKey); len(v) == 1 {
		return v[0], nil
	}
	return "", nil
}

// newHarness serves the test service with the interceptor over e (a
// memstore engine when nil), after outer interceptors.
func newHarness(t testing.TB, e *core.Engine, h Handler, opts []grpcidem.Option, outer ...grpc.UnaryServerInterceptor) *harness {
	t.Helper()
	if e == nil {
		var err error
		e, err = core.New(memstore.New(), core.WithSingleCaller())
		if err != nil {
			t.Fatal(err)
		}
	}
	in, err := grpcidem.UnaryServerInterceptor(e, append([]grpcidem.Option{grpcidem.WithCaller(callerFromMetadata)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	svc := &service{}
	svc.handle.Store(&h)
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(append(outer, in)...))
	srv.RegisterService(&serviceDesc, svc)
	lis := bufconn.Listen(1 << 20)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient("passthrough:///bufnet",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return &harness{svc: svc, conn: conn}
}

// reply is what a client received.
type reply struct {
	resp     *structpb.Struct
	header   metadata.MD
	trailer  metadata.MD
	err      error
	replayed bool
}

func (r reply) code() codes.Code { return status.Code(r.err) }

func (r reply) String() string {
	if r.err != nil {
		return fmt.Sprintf("error %v (replayed %v)", r.err, r.replayed)
	}
	return fmt.Sprintf("%v (replayed %v)", r.resp.AsMap(), r.replayed)
}

// call invokes method with key ("" for none) as account ("" for none).
func (h *harness) call(ctx context.Context, method, account, key string, req map[string]any) reply {
	md := metadata.MD{}
	if key != "" {
		md.Set(grpcidem.MetadataKey, key)
	}
	if account != "" {
		md.Set(accountKey, account)
	}
	return h.callMD(ctx, method, md, req)
}

func (h *harness) callMD(ctx context.Context, method string, md metadata.MD, req map[string]any) reply {
	in, err := structpb.NewStruct(req)
	if err != nil {
		panic(err)
	}
	var r reply
	r.resp = new(structpb.Struct)
	r.err = h.conn.Invoke(metadata.NewOutgoingContext(ctx, md), method, in, r.resp, grpc.Header(&r.header), grpc.Trailer(&r.trailer))
	r.replayed = len(r.header.Get(grpcidem.MetadataReplayed)) == 1 && r.header.Get(grpcidem.MetadataReplayed)[0] == "true"
	return r
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// order answers with the run number, which a second execution could not
// repeat, and sets metadata.
func order(svc func() *service) Handler {
	return func(ctx context.Context, method string, req *structpb.Struct) (*structpb.Struct, error) {
		n := svc().runs.Load()
		_ = grpc.SetHeader(ctx, metadata.Pairs("location", fmt.Sprintf("/orders/%d", n), "x-debug", "a"))
		_ = grpc.SetTrailer(ctx, metadata.Pairs("etag", fmt.Sprintf("v%d", n), "x-trace", "b"))
		return structpb.NewStruct(map[string]any{"order": float64(n), "item": req.AsMap()["item"]})
	}
}

func reason(err error) (string, time.Duration) {
	var r string
	var d time.Duration
	for _, x := range status.Convert(err).Details() {
		switch x := x.(type) {
		case *errdetails.ErrorInfo:
			r = x.Reason
		case *errdetails.RetryInfo:
			d = x.RetryDelay.AsDuration()
		}
	}
	return r, d
}

// newOrders serves order with the location and etag keys recorded.
func newOrders(t *testing.T, e *core.Engine, opts ...grpcidem.Option) *harness {
	var h *harness
	h = newHarness(t, e, order(func() *service { return h.svc }), append([]grpcidem.Option{grpcidem.WithRecordedMetadata("location", "etag", "Authorization", "grpc-status")}, opts...))
	return h
}

func TestFirstExecutionAndReplay(t *testing.T) {
	// Rule: the first call runs the handler and gets all the metadata it
	// set; a duplicate gets the recorded message, the allowlisted header
	// and trailer keys and idempotent-replayed: true, and the handler
	// does not run again.
	h := newOrders(t, nil)
	ctx := ctxT(t)
	first := h.call(ctx, create, "acct_1", "k1", map[string]any{"item": "tea"})
	if first.err != nil || first.replayed || first.resp.AsMap()["order"] != float64(1) {
		t.Fatalf("first: %v", first)
	}
	if got := first.header.Get("location"); len(got) != 1 || got[0] != "/orders/1" || len(first.header.Get("x-debug")) != 1 || len(first.trailer.Get("x-trace")) != 1 {
		t.Fatalf("first: header %v trailer %v", first.header, first.trailer)
	}
	again := h.call(ctx, create, "acct_1", "k1", map[string]any{"item": "tea"})
	if again.err != nil || !again.replayed || !proto.Equal(again.resp, first.resp) {
		t.Fatalf("replay: %v, want %v replayed", again, first)
	}
	if got := again.header.Get("location"); len(got) != 1 || got[0] != "/orders/1" {
		t.Errorf("replay: header %v, want the recorded location", again.header)
	}
	if got := again.trailer.Get("etag"); len(got) != 1 || got[0] != "v1" {
		t.Errorf("replay: trailer %v, want the recorded etag", again.trailer)
	}
	if len(again.header.Get("x-debug")) != 0 || len(again.trailer.Get("x-trace")) != 0 {
		t.Errorf("replay: keys outside the allowlist were replayed: header %v trailer %v", again.header, again.trailer)
	}
	if n := h.svc.runs.Load(); n != 1 {
		t.Errorf("handler ran %d times, want 1", n)
	}
}

func TestMismatch(t *testing.T) {
	// Rule: the same key with another request message, or on another
	// method sharing the scope, is FailedPrecondition (KEY_REUSED), never
	// a replay; nothing runs.
	h := newOrders(t, nil, grpcidem.WithRouteOptions(core.Scope("orders")))
	ctx := ctxT(t)
	if r := h.call(ctx, create, "acct_1", "k1", map[string]any{"item": "tea", "quantity": 2}); r.err != nil {
		t.Fatal(r)
	}
	for _, tc := range []struct {
		name   string
		method string
		req    map[string]any
	}{
		{"OtherMessage", create, map[string]any{"item": "tea", "quantity": 3}},
		{"OtherMethod", other, map[string]any{"item": "tea", "quantity": 2}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := h.call(ctx, tc.method, "acct_1", "k1", tc.req)
			if r.code() != codes.FailedPrecondition {
				t.Fatalf("got %v, want FailedPrecondition", r)
			}
			if why, _ := reason(r.err); why != "KEY_REUSED" {
				t.Errorf("reason %q, want KEY_REUSED", why)
			}
		})
	}
	if n := h.svc.runs.Load(); n != 1 {
		t.Errorf("handler ran %d times, want 1", n)
	}
}

func TestFingerprintIsDeterministic(t *testing.T) {
	// Rule: the fingerprint is over the message as read, not the bytes as
	// sent: a map built in another order has the same fingerprint; a
	// changed value or method does not.
	a, _ := structpb.NewStruct(map[string]any{"a": 1, "b": "x", "c": map[string]any{"d": true, "e": 2}})
	b, _ := structpb.NewStruct(map[string]any{"c": map[string]any{"e": 2, "d": true}, "b": "x", "a": 1})
	c, _ := structpb.NewStruct(map[string]any{"a": 1, "b": "y", "c": map[string]any{"d": true, "e": 2}})
	fa, _ := grpcidem.Fingerprint(create, a)
	fb, _ := grpcidem.Fingerprint(create, b)
	fc, _ := grpcidem.Fingerprint(create, c)
	fo, _ := grpcidem.Fingerprint(other, a)
	if string(fa) != string(fb) || string(fa) == string(fc) || string(fa) == string(fo) {
		t.Fatalf("fingerprints: a %x b %x c %x other method %x", fa, fb, fc, fo)
	}
	if _, err := grpcidem.Fingerprint(create, "not a message"); err == nil {
		t.Fatal("a string was fingerprinted")
	}
}

func TestInFlight(t *testing.T) {
	// Rule: a duplicate of a call still running is refused at once with
	// Aborted (IN_PROGRESS) and a RetryInfo, never waiting for the first
	// and never running twice; once the first completes, it replays.
	entered, gate := make(chan struct{}), make(chan struct{})
	var once sync.Once
	var h *harness
	h = newHarness(t, nil, func(ctx context.Context, method string, req *structpb.Struct) (*structpb.Struct, error) {
		once.Do(func() { close(entered) })
		<-gate
		return structpb.NewStruct(map[string]any{"order": float64(h.svc.runs.Load())})
	}, nil)
	ctx := ctxT(t)
	firstDone := make(chan reply)
	go func() { firstDone <- h.call(ctx, create, "acct_1", "k1", map[string]any{"item": "tea"}) }()
	<-entered
	const dups = 8
	var wg sync.WaitGroup
	replies := make([]reply, dups)
	for i := range dups {
		wg.Add(1)
		go func() {
			defer wg.Done()
			replies[i] = h.call(ctx, create, "acct_1", "k1", map[string]any{"item": "tea"})
		}()
	}
	wg.Wait() // none waits for the gate
	for _, r := range replies {
		if r.code() != codes.Aborted {
			t.Fatalf("duplicate: %v, want Aborted", r)
		}
		if why, delay := reason(r.err); why != "IN_PROGRESS" || delay != core.DefaultRetryAfter {
			t.Fatalf("duplicate: reason %q, retry delay %v; want IN_PROGRESS, %v", why, delay, core.DefaultRetryAfter)
		}
	}
	close(gate)
	first := <-firstDone
	if first.err != nil || first.replayed {
		t.Fatalf("first: %v", first)
	}
	if r := h.call(ctx, create, "acct_1", "k1", map[string]any{"item": "tea"}); !r.replayed || !proto.Equal(r.resp, first.resp) {
		t.Fatalf("after: %v, want the first's answer replayed", r)
	}
	if n := h.svc.runs.Load(); n != 1 {
		t.Errorf("handler ran %d times, want 1", n)
	}
}

func TestConcurrentDuplicates(t *testing.T) {
	// Rule: a storm of concurrent calls with one key runs the handler once;
	// every other call is refused in progress or replays the one answer.
	var h *harness
	h = newOrders(t, nil)
	ctx := ctxT(t)
	const n = 16
	var wg sync.WaitGroup
	replies := make([]reply, n)
	start := make(chan struct{})
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			replies[i] = h.call(ctx, create, "acct_1", "storm", map[string]any{"item": "tea"})
		}()
	}
	close(start)
	wg.Wait()
	if runs := h.svc.runs.Load(); runs != 1 {
		t.Fatalf("handler ran %d times, want 1", runs)
	}
	for _, r := range replies {
		if r.err != nil && r.code() != codes.Aborted || r.err == nil && r.resp.AsMap()["order"] != float64(1) {
			t.Errorf("reply %v", r)
		}
	}
}

func TestKeyAndCaller(t *testing.T) {
	// Rule: a missing or malformed key is InvalidArgument, a caller that
	// cannot be named is Unauthenticated, before anything runs; two callers
	// with one key never share a record.
	h := newOrders(t, nil)
	ctx := ctxT(t)
	for _, tc := range []struct {
		name   string
		md     metadata.MD
		code   codes.Code
		reason string
	}{
		{"MissingKey", metadata.Pairs(accountKey, "acct_1"), codes.InvalidArgument, "MISSING_KEY"},
		{"KeyTwice", metadata.Pairs(accountKey, "acct_1", grpcidem.MetadataKey, "a", grpcidem.MetadataKey, "b"), codes.InvalidArgument, "INVALID_KEY"},
		{"KeyTooLong", metadata.Pairs(accountKey, "acct_1", grpcidem.MetadataKey, strings.Repeat("k", core.MaxKeyLen+1)), codes.InvalidArgument, "INVALID_KEY"},
		{"BadQuotedKey", metadata.Pairs(accountKey, "acct_1", grpcidem.MetadataKey, `"abc`), codes.InvalidArgument, "INVALID_KEY"},
		{"NoCaller", metadata.Pairs(grpcidem.MetadataKey, "k"), codes.Unauthenticated, "UNAUTHENTICATED"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := h.callMD(ctx, create, tc.md, map[string]any{"item": "tea"})
			if why, _ := reason(r.err); r.code() != tc.code || why != tc.reason {
				t.Fatalf("got %v (%s), want %v %s", r, why, tc.code, tc.reason)
			}
		})
	}
	if n := h.svc.runs.Load(); n != 0 {
		t.Fatalf("handler ran %d times, want 0", n)
	}
	a := h.call(ctx, create, "acct_1", "shared", map[string]any{"item": "tea"})
	b := h.call(ctx, create, "acct_2", "shared", map[string]any{"item": "tea"})
	if a.err != nil || b.err != nil || a.replayed || b.replayed || proto.Equal(a.resp, b.resp) {
		t.Fatalf("two callers, one key: %v and %v, want two executions", a, b)
	}
	if r := h.call(ctx, create, "acct_2", "shared", map[string]any{"item": "tea"}); !r.replayed || !proto.Equal(r.resp, b.resp) {
		t.Fatalf("acct_2 again: %v, want its own answer %v", r, b)
	}
	// Quoted and raw keys address the same record, as over HTTP.
	if r := h.call(ctx, create, "acct_2", `"shared"`, map[string]any{"item": "tea"}); !r.replayed || !proto.Equal(r.resp, b.resp) {
		t.Fatalf("quoted key: %v, want %v replayed", r, b)
	}
}

func TestConfig(t *testing.T) {
	// Rule: a configuration that would share one key space by accident, or
	// names a method wrongly, is refused at start-up with core.ErrConfig.
	e, err := core.New(memstore.New(), core.WithSingleCaller())
	if err != nil {
		t.Fatal(err)
	}
	for name, opts := range map[string][]grpcidem.Option{
		"NoCaller":   nil,
		"BothCaller": {grpcidem.WithSingleCaller(), grpcidem.WithCaller(callerFromMetadata)},
		"BadMethod":  {grpcidem.WithSingleCaller(), grpcidem.WithMethod("Create", core.KeyOptional())},
	} {
		if _, err := grpcidem.UnaryServerInterceptor(e, opts...); !errors.Is(err, core.ErrConfig) {
			t.Errorf("%s: err %v, want core.ErrConfig", name, err)
		}
	}
}

func TestHandlerOutcomes(t *testing.T) {
	// Rule: the handler's gRPC code decides the record as its HTTP
	// equivalent does (HTTPStatus): client errors are recorded and replayed
	// with their details; ResourceExhausted, Aborted, Unavailable and
	// Release release the key, so a retry runs; a failure after MarkEffect
	// is indeterminate, and its recorded error is replayed, never run again.
	notFound, _ := status.New(codes.NotFound, "no such account").WithDetails(&errdetails.ResourceInfo{ResourceName: "acct_9"})
	for _, tc := range []struct {
		name     string
		err      error
		effect   bool
		release  bool
		runs     int64 // after two calls
		replayed bool
	}{
		{"NotFoundRecorded", notFound.Err(), false, false, 1, true},
		{"InvalidArgumentRecorded", status.Error(codes.InvalidArgument, "bad quantity"), false, false, 1, true},
		{"ResourceExhaustedReleased", status.Error(codes.ResourceExhausted, "slow down"), false, false, 2, false},
		{"AbortedReleased", status.Error(codes.Aborted, "conflict"), false, false, 2, false},
		{"UnavailableReleased", status.Error(codes.Unavailable, "provider down"), false, false, 2, false},
		{"PlainErrorReleased", errors.New("boom"), false, false, 2, false},
		{"ReleaseReleases", status.Error(codes.InvalidArgument, "bad quantity"), false, true, 2, false},
		{"InternalAfterEffectIndeterminate", status.Error(codes.Internal, "provider timed out"), true, false, 1, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, nil, func(ctx context.Context, method string, req *structpb.Struct) (*structpb.Struct, error) {
				if tc.effect {
					if err := core.MarkEffect(ctx); err != nil {
						t.Error(err)
					}
				}
				if tc.release {
					if err := core.Release(ctx); err != nil {
						t.Error(err)
					}
				}
				return nil, tc.err
			}, nil)
			ctx := ctxT(t)
			first := h.call(ctx, create, "acct_1", "k", map[string]any{"item": "tea"})
			second := h.call(ctx, create, "acct_1", "k", map[string]any{"item": "tea"})
			want := status.Convert(tc.err)
			for i, r := range []reply{first, second} {
				if got := status.Convert(r.err); got.Code() != want.Code() || got.Message() != want.Message() || len(got.Details()) != len(want.Details()) {
					t.Errorf("call %d: %v, want %v", i+1, r, want)
				}
			}
			if second.replayed != tc.replayed {
				t.Errorf("second call replayed %v, want %v", second.replayed, tc.replayed)
			}
			if n := h.svc.runs.Load(); n != tc.runs {
				t.Errorf("handler ran %d times, want %d", n, tc.runs)
			}
		})
	}
}

// recovery turns a handler's panic into Internal, as grpc-ecosystem's
// recovery interceptor does.
func recovery(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (resp any, err error) {
	defer func() {
		if v := recover(); v != nil {
			resp, err = nil, status.Errorf(codes.Internal, "panic: %v", v)
		}
	}()
	return handler(ctx, req)
}

func TestPanic(t *testing.T) {
	// Rule: a panic releases the key and goes on to the outer recovery, so
	// a retry runs; after MarkEffect it leaves the record indeterminate:
	// the retry gets Internal (OUTCOME_UNKNOWN), never a second run.
	for _, effect := range []bool{false, true} {
		t.Run(fmt.Sprintf("Effect%v", effect), func(t *testing.T) {
			h := newHarness(t, nil, func(ctx context.Context, method string, req *structpb.Struct) (*structpb.Struct, error) {
				if effect {
					_ = core.MarkEffect(ctx)
				}
				panic("boom")
			}, nil, recovery)
			ctx := ctxT(t)
			if r := h.call(ctx, create, "acct_1", "k", map[string]any{"item": "tea"}); r.code() != codes.Internal {
				t.Fatalf("first: %v, want the recovery's Internal", r)
			}
			second := h.call(ctx, create, "acct_1", "k", map[string]any{"item": "tea"})
			wantRuns, wantReason := int64(2), ""
			if effect {
				wantRuns, wantReason = 1, "OUTCOME_UNKNOWN"
			}
			if why, _ := reason(second.err); second.code() != codes.Internal || why != wantReason {
				t.Errorf("second: %v (reason %q), want Internal %q", second, why, wantReason)
			}
			if n := h.svc.runs.Load(); n != wantRuns {
				t.Errorf("handler ran %d times, want %d", n, wantRuns)
			}
		})
	}
}

func TestOutlivesClient(t *testing.T) {
	// Rule: the attempt outlives its client: a client whose deadline
	// passes does not cancel the handler, whose answer is recorded for the
	// retry.
	gate, done := make(chan struct{}), make(chan error, 1)
	var h *harness
	h = newHarness(t, nil, func(ctx context.Context, method string, req *structpb.Struct) (*structpb.Struct, error) {
		<-gate
		err := ctx.Err()
		done <- err
		if err != nil {
			return nil, status.FromContextError(err).Err()
		}
		return structpb.NewStruct(map[string]any{"order": float64(h.svc.runs.Load())})
	}, nil)
	short, cancel := context.WithTimeout(ctxT(t), 50*time.Millisecond)
	defer cancel()
	if r := h.call(short, create, "acct_1", "k", map[string]any{"item": "tea"}); r.code() != codes.DeadlineExceeded {
		t.Fatalf("first: %v, want DeadlineExceeded", r)
	}
	close(gate)
	if err := <-done; err != nil {
		t.Fatalf("the handler's context ended with its client: %v", err)
	}
	// The handler returned; its outcome is recorded before the interceptor
	// returns, which the retry may overtake: retry while it is in progress.
	ctx := ctxT(t)
	for {
		r := h.call(ctx, create, "acct_1", "k", map[string]any{"item": "tea"})
		if r.code() == codes.Aborted {
			continue
		}
		if !r.replayed || r.resp.AsMap()["order"] != float64(1) {
			t.Fatalf("retry: %v, want the first answer replayed", r)
		}
		break
	}
}

func TestUnprotected(t *testing.T) {
	// Rule: methods left out with WithSkipper, or whose route takes calls
	// without a key (core.KeyOptional), run unprotected every time.
	var h *harness
	h = newHarness(t, nil, order(func() *service { return h.svc }), []grpcidem.Option{
		grpcidem.WithMethod(get, core.KeyOptional()),
		grpcidem.WithSkipper(func(_ context.Context, m string) bool { return m == other }),
	})
	ctx := ctxT(t)
	for _, m := range []string{get, get, other, other} {
		if r := h.call(ctx, m, "acct_1", "", nil); r.err != nil || r.replayed {
			t.Fatalf("%s: %v", m, r)
		}
	}
	if r := h.call(ctx, create, "acct_1", "", nil); r.code() != codes.InvalidArgument {
		t.Fatalf("create without a key: %v, want InvalidArgument", r)
	}
	if n := h.svc.runs.Load(); n != 4 {
		t.Errorf("handler ran %d times, want 4", n)
	}
}

func TestNotKept(t *testing.T) {
	// Rule: a response past the recording cap reaches the first client
	// whole; a replay cannot give it and says so (Internal,
	// RESPONSE_NOT_KEPT), never running the handler again.
	e, err := core.New(memstore.New(), core.WithSingleCaller(), core.WithMaxResponseBody(16))
	if err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, e, func(ctx context.Context, method string, req *structpb.Struct) (*structpb.Struct, error) {
		return structpb.NewStruct(map[string]any{"blob": "0123456789abcdef0123456789abcdef"})
	}, nil)
	ctx := ctxT(t)
	if r := h.call(ctx, create, "acct_1", "k", nil); r.err != nil || r.resp.AsMap()["blob"] == nil {
		t.Fatalf("first: %v", r)
	}
	r := h.call(ctx, create, "acct_1", "k", nil)
	if why, _ := reason(r.err); r.code() != codes.Internal || why != "RESPONSE_NOT_KEPT" {
		t.Fatalf("replay: %v, want Internal RESPONSE_NOT_KEPT", r)
	}
	if n := h.svc.runs.Load(); n != 1 {
		t.Errorf("handler ran %d times, want 1", n)
	}
}

func TestObserverSeesDecisions(t *testing.T) {
	// Rule: gRPC calls report their decisions to the engine's observer as
	// HTTP requests do, with the full method as scope.
	var mu sync.Mutex
	var got []core.Decision
	e, err := core.New(memstore.New(), core.WithSingleCaller(), core.WithObserver(func(_ context.Context, ev core.Event) {
		mu.Lock()
		defer mu.Unlock()
		if ev.Scope != create {
			t.Errorf("scope %q, want %q", ev.Scope, create)
		}
		got = append(got, ev.Decision)
	}))
	if err != nil {
		t.Fatal(err)
	}
	h := newOrders(t, e)
	ctx := ctxT(t)
	h.call(ctx, create, "acct_1", "k", map[string]any{"item": "tea"})
	h.call(ctx, create, "acct_1", "k", map[string]any{"item": "tea"})
	h.call(ctx, create, "acct_1", "k", map[string]any{"item": "milk"})
	h.call(ctx, create, "acct_1", "", nil)
	mu.Lock()
	defer mu.Unlock()
	want := []core.Decision{core.Executed, core.Replayed, core.Mismatch, core.Invalid}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("decisions %v, want %v", got, want)
	}
}
