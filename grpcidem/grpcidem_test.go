package grpcidem_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/memstore"
	"github.com/idemkit/idem/core/observe"
	"github.com/idemkit/idem/core/store"
	"github.com/idemkit/idem/grpcidem"
	"github.com/idemkit/idem/grpcidem/internal/grpcidemtest"
)

type harness = grpcidemtest.Server

const (
	create = grpcidemtest.Create
	other  = grpcidemtest.Other
	get    = grpcidemtest.Get
)

const accountKey = grpcidemtest.AccountKey

var callerFromMetadata = grpcidemtest.CallerFromMetadata

type reply = grpcidemtest.Reply

// newHarness serves h with the interceptor over e (a memstore engine when
// nil).
func newHarness(t testing.TB, e *core.Engine, h grpcidemtest.Handler, opts []grpcidem.Option, outer ...grpc.UnaryServerInterceptor) *harness {
	t.Helper()
	if e == nil {
		var err error
		e, err = core.New(memstore.New(), core.WithSingleCaller())
		if err != nil {
			t.Fatal(err)
		}
	}
	return grpcidemtest.New(t, e, h, opts, outer...)
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// failsafe bounds a wait that must end: shorter than ctxT's deadline, so
// the wait's own message wins over the call's DeadlineExceeded.
const failsafe = 5 * time.Second

// entering waits for a held handler to signal entered, and fails the test
// when its call answers first (it never reached the handler) or nothing
// happens within failsafe.
func entering(t *testing.T, entered <-chan struct{}, call <-chan reply) {
	t.Helper()
	select {
	case <-entered:
	case r := <-call:
		t.Fatalf("the first call answered before its handler ran: %v", r)
	case <-time.After(failsafe):
		t.Fatalf("the first call's handler did not start within %v", failsafe)
	}
}

// order answers with the run number, which a second execution could not
// repeat, and sets metadata.
func order(svc func() *harness) grpcidemtest.Handler {
	return func(ctx context.Context, method string, req *structpb.Struct) (*structpb.Struct, error) {
		n := svc().Runs.Load()
		_ = grpc.SetHeader(ctx, metadata.Pairs("location", fmt.Sprintf("/orders/%d", n), "x-debug", "a"))
		_ = grpc.SetTrailer(ctx, metadata.Pairs("etag", fmt.Sprintf("v%d", n), "x-trace", "b"))
		return structpb.NewStruct(map[string]any{"order": float64(n), "item": req.AsMap()["item"]})
	}
}

func reason(err error) (string, time.Duration) { return reply{Err: err}.Reason() }

// newOrders serves order with the location and etag keys recorded.
func newOrders(t *testing.T, e *core.Engine, opts ...grpcidem.Option) *harness {
	var h *harness
	h = newHarness(t, e, order(func() *harness { return h }), append([]grpcidem.Option{grpcidem.WithRecordedMetadata("location", "etag", "Authorization", "grpc-status")}, opts...))
	return h
}

func TestFirstExecutionAndReplay(t *testing.T) {
	// Rule: the first call runs the handler and gets all the metadata it
	// set; a duplicate gets the recorded message, the allowlisted header
	// and trailer keys and idempotent-replayed: true, and the handler
	// does not run again.
	h := newOrders(t, nil)
	ctx := ctxT(t)
	first := h.Call(ctx, create, "acct_1", "k1", map[string]any{"item": "tea"})
	if first.Err != nil || first.Replayed || first.Resp.AsMap()["order"] != float64(1) {
		t.Fatalf("first: %v", first)
	}
	if got := first.Header.Get("location"); len(got) != 1 || got[0] != "/orders/1" || len(first.Header.Get("x-debug")) != 1 || len(first.Trailer.Get("x-trace")) != 1 {
		t.Fatalf("first: header %v trailer %v", first.Header, first.Trailer)
	}
	again := h.Call(ctx, create, "acct_1", "k1", map[string]any{"item": "tea"})
	if again.Err != nil || !again.Replayed || !proto.Equal(again.Resp, first.Resp) {
		t.Fatalf("replay: %v, want %v replayed", again, first)
	}
	if got := again.Header.Get("location"); len(got) != 1 || got[0] != "/orders/1" {
		t.Errorf("replay: header %v, want the recorded location", again.Header)
	}
	if got := again.Trailer.Get("etag"); len(got) != 1 || got[0] != "v1" {
		t.Errorf("replay: trailer %v, want the recorded etag", again.Trailer)
	}
	if len(again.Header.Get("x-debug")) != 0 || len(again.Trailer.Get("x-trace")) != 0 {
		t.Errorf("replay: keys outside the allowlist were replayed: header %v trailer %v", again.Header, again.Trailer)
	}
	if n := h.Runs.Load(); n != 1 {
		t.Errorf("handler ran %d times, want 1", n)
	}
}

func TestMismatch(t *testing.T) {
	// Rule: the same key with another request message, or on another
	// method (the scope is empty by default: a key is unique within its
	// caller, whatever the method), is FailedPrecondition (KEY_REUSED),
	// never a replay; nothing runs.
	h := newOrders(t, nil)
	ctx := ctxT(t)
	if r := h.Call(ctx, create, "acct_1", "k1", map[string]any{"item": "tea", "quantity": 2}); r.Err != nil {
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
			r := h.Call(ctx, tc.method, "acct_1", "k1", tc.req)
			if r.Code() != codes.FailedPrecondition {
				t.Fatalf("got %v, want FailedPrecondition", r)
			}
			if why, _ := reason(r.Err); why != "KEY_REUSED" {
				t.Errorf("reason %q, want KEY_REUSED", why)
			}
		})
	}
	if n := h.Runs.Load(); n != 1 {
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
		return structpb.NewStruct(map[string]any{"order": float64(h.Runs.Load())})
	}, nil)
	open := sync.OnceFunc(func() { close(gate) })
	t.Cleanup(open) // a test that ends early frees the held handler
	ctx := ctxT(t)
	firstDone := make(chan reply, 1)
	go func() { firstDone <- h.Call(ctx, create, "acct_1", "k1", map[string]any{"item": "tea"}) }()
	entering(t, entered, firstDone)
	const dups = 8
	var wg sync.WaitGroup
	replies := make([]reply, dups)
	for i := range dups {
		wg.Add(1)
		go func() {
			defer wg.Done()
			replies[i] = h.Call(ctx, create, "acct_1", "k1", map[string]any{"item": "tea"})
		}()
	}
	wg.Wait() // none waits for the gate
	for _, r := range replies {
		if r.Code() != codes.Aborted {
			t.Fatalf("duplicate: %v, want Aborted", r)
		}
		if why, delay := reason(r.Err); why != "IN_PROGRESS" || delay != core.DefaultRetryAfter {
			t.Fatalf("duplicate: reason %q, retry delay %v; want IN_PROGRESS, %v", why, delay, core.DefaultRetryAfter)
		}
	}
	open()
	first := <-firstDone
	if first.Err != nil || first.Replayed {
		t.Fatalf("first: %v", first)
	}
	if r := h.Call(ctx, create, "acct_1", "k1", map[string]any{"item": "tea"}); !r.Replayed || !proto.Equal(r.Resp, first.Resp) {
		t.Fatalf("after: %v, want the first's answer replayed", r)
	}
	if n := h.Runs.Load(); n != 1 {
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
			replies[i] = h.Call(ctx, create, "acct_1", "storm", map[string]any{"item": "tea"})
		}()
	}
	close(start)
	wg.Wait()
	if runs := h.Runs.Load(); runs != 1 {
		t.Fatalf("handler ran %d times, want 1", runs)
	}
	for _, r := range replies {
		if r.Err != nil && r.Code() != codes.Aborted || r.Err == nil && r.Resp.AsMap()["order"] != float64(1) {
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
			r := h.CallMD(ctx, create, tc.md, map[string]any{"item": "tea"})
			if why, _ := reason(r.Err); r.Code() != tc.code || why != tc.reason {
				t.Fatalf("got %v (%s), want %v %s", r, why, tc.code, tc.reason)
			}
		})
	}
	if n := h.Runs.Load(); n != 0 {
		t.Fatalf("handler ran %d times, want 0", n)
	}
	a := h.Call(ctx, create, "acct_1", "shared", map[string]any{"item": "tea"})
	b := h.Call(ctx, create, "acct_2", "shared", map[string]any{"item": "tea"})
	if a.Err != nil || b.Err != nil || a.Replayed || b.Replayed || proto.Equal(a.Resp, b.Resp) {
		t.Fatalf("two callers, one key: %v and %v, want two executions", a, b)
	}
	if r := h.Call(ctx, create, "acct_2", "shared", map[string]any{"item": "tea"}); !r.Replayed || !proto.Equal(r.Resp, b.Resp) {
		t.Fatalf("acct_2 again: %v, want its own answer %v", r, b)
	}
	// Quoted and raw keys address the same record, as over HTTP.
	if r := h.Call(ctx, create, "acct_2", `"shared"`, map[string]any{"item": "tea"}); !r.Replayed || !proto.Equal(r.Resp, b.Resp) {
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
		{"InvalidArgumentReleased", status.Error(codes.InvalidArgument, "bad quantity"), false, false, 2, false}, // a validation failure is not saved
		{"InvalidArgumentAfterEffectRecorded", status.Error(codes.InvalidArgument, "bad quantity"), true, false, 1, true},
		{"FailedPreconditionRecorded", status.Error(codes.FailedPrecondition, "account frozen"), false, false, 1, true},
		{"ResourceExhaustedAfterEffectIndeterminate", status.Error(codes.ResourceExhausted, "slow down"), true, false, 1, true},
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
			first := h.Call(ctx, create, "acct_1", "k", map[string]any{"item": "tea"})
			second := h.Call(ctx, create, "acct_1", "k", map[string]any{"item": "tea"})
			want := status.Convert(tc.err)
			for i, r := range []reply{first, second} {
				if got := status.Convert(r.Err); got.Code() != want.Code() || got.Message() != want.Message() || len(got.Details()) != len(want.Details()) {
					t.Errorf("call %d: %v, want %v", i+1, r, want)
				}
			}
			if second.Replayed != tc.replayed {
				t.Errorf("second call replayed %v, want %v", second.Replayed, tc.replayed)
			}
			if n := h.Runs.Load(); n != tc.runs {
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
			if r := h.Call(ctx, create, "acct_1", "k", map[string]any{"item": "tea"}); r.Code() != codes.Internal {
				t.Fatalf("first: %v, want the recovery's Internal", r)
			}
			second := h.Call(ctx, create, "acct_1", "k", map[string]any{"item": "tea"})
			wantRuns, wantReason := int64(2), ""
			if effect {
				wantRuns, wantReason = 1, "OUTCOME_UNKNOWN"
			}
			if why, _ := reason(second.Err); second.Code() != codes.Internal || why != wantReason {
				t.Errorf("second: %v (reason %q), want Internal %q", second, why, wantReason)
			}
			if n := h.Runs.Load(); n != wantRuns {
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
	callCtx := make(chan context.Context, 1) // the call's own context, as the server made it
	outer := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if info.FullMethod == create {
			select {
			case callCtx <- ctx: // the first call's
			default:
			}
		}
		return handler(ctx, req)
	}
	var h *harness
	h = newHarness(t, nil, func(ctx context.Context, method string, req *structpb.Struct) (*structpb.Struct, error) {
		if method != create {
			return structpb.NewStruct(nil) // the warm-up
		}
		<-gate
		err := ctx.Err()
		done <- err
		if err != nil {
			return nil, status.FromContextError(err).Err()
		}
		return structpb.NewStruct(map[string]any{"order": float64(h.Runs.Load())})
	}, nil, outer)
	open := sync.OnceFunc(func() { close(gate) })
	t.Cleanup(open) // a test that ends early frees the held handler
	ctx := ctxT(t)
	// grpc.NewClient dials on first use: warm the connection, so that the
	// first call's short deadline is not spent on the dial and the HTTP/2
	// handshake before the call is even sent.
	if r := h.Call(ctx, other, "acct_1", "warm", map[string]any{}); r.Err != nil {
		t.Fatalf("warm-up: %v", r)
	}
	want := float64(h.Runs.Load() + 1) // the first call's answer: its run number
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if r := h.Call(short, create, "acct_1", "k", map[string]any{"item": "tea"}); r.Code() != codes.DeadlineExceeded {
		t.Fatalf("first: %v, want DeadlineExceeded", r)
	}
	var server context.Context
	select {
	case server = <-callCtx:
	case <-time.After(failsafe):
		t.Fatalf("the first call never reached the server: its deadline passed before it was sent")
	}
	select {
	case <-server.Done(): // the server has seen the deadline pass
	case <-time.After(failsafe):
		t.Fatalf("the server's context of the first call did not end within %v of its deadline", failsafe)
	}
	open()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("the handler's context ended with its client: %v", err)
		}
	case <-time.After(failsafe):
		t.Fatalf("the handler did not return within %v of its gate opening", failsafe)
	}
	// The handler returned; its outcome is recorded before the interceptor
	// returns, which the retry may overtake: retry while it is in progress.
	for {
		r := h.Call(ctx, create, "acct_1", "k", map[string]any{"item": "tea"})
		if r.Code() == codes.Aborted {
			continue
		}
		if !r.Replayed || r.Resp.AsMap()["order"] != want {
			t.Fatalf("retry: %v, want the first answer replayed", r)
		}
		break
	}
}

func TestUnprotected(t *testing.T) {
	// Rule: methods left out with WithSkipper, or whose route takes calls
	// without a key (core.KeyOptional), run unprotected every time.
	var h *harness
	h = newHarness(t, nil, order(func() *harness { return h }), []grpcidem.Option{
		grpcidem.WithMethod(get, core.KeyOptional()),
		grpcidem.WithSkipper(func(_ context.Context, m string) bool { return m == other }),
	})
	ctx := ctxT(t)
	for _, m := range []string{get, get, other, other} {
		if r := h.Call(ctx, m, "acct_1", "", nil); r.Err != nil || r.Replayed {
			t.Fatalf("%s: %v", m, r)
		}
	}
	if r := h.Call(ctx, create, "acct_1", "", nil); r.Code() != codes.InvalidArgument {
		t.Fatalf("create without a key: %v, want InvalidArgument", r)
	}
	if n := h.Runs.Load(); n != 4 {
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
	if r := h.Call(ctx, create, "acct_1", "k", nil); r.Err != nil || r.Resp.AsMap()["blob"] == nil {
		t.Fatalf("first: %v", r)
	}
	r := h.Call(ctx, create, "acct_1", "k", nil)
	if why, _ := reason(r.Err); r.Code() != codes.Internal || why != "RESPONSE_NOT_KEPT" {
		t.Fatalf("replay: %v, want Internal RESPONSE_NOT_KEPT", r)
	}
	if n := h.Runs.Load(); n != 1 {
		t.Errorf("handler ran %d times, want 1", n)
	}
}

func TestObserverSeesDecisions(t *testing.T) {
	// Rule: gRPC calls report their decisions to the engine's observer as
	// HTTP requests do, labelled with the full method (Event.Route); the
	// scope is empty (no core.Scope option).
	var mu sync.Mutex
	var got []observe.Decision
	e, err := core.New(memstore.New(), core.WithSingleCaller(), core.WithObserver(func(_ context.Context, ev observe.Event) {
		mu.Lock()
		defer mu.Unlock()
		if ev.Scope != "" || ev.Route != create {
			t.Errorf("scope %q, route %q, want \"\" and %q", ev.Scope, ev.Route, create)
		}
		got = append(got, ev.Decision)
	}))
	if err != nil {
		t.Fatal(err)
	}
	h := newOrders(t, e)
	ctx := ctxT(t)
	h.Call(ctx, create, "acct_1", "k", map[string]any{"item": "tea"})
	h.Call(ctx, create, "acct_1", "k", map[string]any{"item": "tea"})
	h.Call(ctx, create, "acct_1", "k", map[string]any{"item": "milk"})
	h.Call(ctx, create, "acct_1", "", nil)
	mu.Lock()
	defer mu.Unlock()
	want := []observe.Decision{observe.DecisionExecuted, observe.DecisionReplayed, observe.DecisionMismatch, observe.DecisionInvalid}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("decisions %v, want %v", got, want)
	}
}

// downStore is a store whose claims fail as an unreachable database's do.
type downStore struct{ store.Store }

func (downStore) Claim(context.Context, store.ClaimRequest) (store.ClaimResult, error) {
	return store.ClaimResult{}, fmt.Errorf("%w: dial tcp 10.0.0.7:5432: connection refused", core.ErrStoreUnavailable)
}

func TestStoreUnavailable(t *testing.T) {
	// Rule: an unreachable store fails closed: Unavailable with a
	// RetryInfo, the handler does not run, and the store's own error text
	// (hosts, addresses) does not reach the client.
	e, err := core.New(downStore{memstore.New()}, core.WithSingleCaller(), core.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	h := newOrders(t, e)
	r := h.Call(ctxT(t), create, "acct_1", "k", map[string]any{"item": "tea"})
	if why, delay := r.Reason(); r.Code() != codes.Unavailable || why != "STORE_UNAVAILABLE" || delay != core.DefaultRetryAfter {
		t.Fatalf("got %v (reason %q, retry delay %v), want Unavailable STORE_UNAVAILABLE after %v", r, why, delay, core.DefaultRetryAfter)
	}
	if strings.Contains(r.Err.Error(), "10.0.0.7") {
		t.Errorf("the store's error reached the client: %v", r.Err)
	}
	if n := h.Runs.Load(); n != 0 {
		t.Errorf("handler ran %d times, want 0", n)
	}
}

// watchStore signals every claim that met a record in progress.
type watchStore struct {
	store.Store
	busy chan struct{}
}

func (s watchStore) Claim(ctx context.Context, req store.ClaimRequest) (store.ClaimResult, error) {
	res, err := s.Store.Claim(ctx, req)
	if err == nil && !res.Claimed && res.Record.State == store.StateInProgress {
		select {
		case s.busy <- struct{}{}:
		default:
		}
	}
	return res, err
}

func TestWaitInFlight(t *testing.T) {
	// Rule: with core.WaitInFlight on the method, a duplicate waits for
	// the first call and replays its answer instead of being refused.
	store := watchStore{Store: memstore.New(), busy: make(chan struct{}, 1)}
	e, err := core.New(store, core.WithSingleCaller())
	if err != nil {
		t.Fatal(err)
	}
	entered, gate := make(chan struct{}), make(chan struct{})
	var once sync.Once
	var h *harness
	h = newHarness(t, e, func(ctx context.Context, method string, req *structpb.Struct) (*structpb.Struct, error) {
		once.Do(func() { close(entered) })
		<-gate
		return structpb.NewStruct(map[string]any{"order": float64(h.Runs.Load())})
	}, []grpcidem.Option{grpcidem.WithMethod(create, core.WaitInFlight(10*time.Second))})
	open := sync.OnceFunc(func() { close(gate) })
	t.Cleanup(open) // a test that ends early frees the held handler
	ctx := ctxT(t)
	first, dup := make(chan reply, 1), make(chan reply, 1)
	go func() { first <- h.Call(ctx, create, "acct_1", "k", map[string]any{"item": "tea"}) }()
	entering(t, entered, first)
	go func() { dup <- h.Call(ctx, create, "acct_1", "k", map[string]any{"item": "tea"}) }()
	select {
	case <-store.busy: // the duplicate met the first in progress, and waits
	case r := <-dup:
		t.Fatalf("duplicate: %v before it met the first in progress", r)
	case r := <-first:
		t.Fatalf("first: %v while its handler is held", r)
	case <-time.After(failsafe):
		t.Fatalf("the duplicate did not meet the first in progress within %v", failsafe)
	}
	open()
	a, b := <-first, <-dup
	if a.Err != nil || b.Err != nil || !b.Replayed || !proto.Equal(a.Resp, b.Resp) {
		t.Fatalf("first %v, duplicate %v; want the duplicate to replay the first", a, b)
	}
	if n := h.Runs.Load(); n != 1 {
		t.Errorf("handler ran %d times, want 1", n)
	}
}

func TestResolver(t *testing.T) {
	// Rule: a resolver settles an indeterminate call with
	// grpcidem.Response: duplicates get that message, replayed, and the
	// handler does not run again.
	e, err := core.New(memstore.New(), core.WithSingleCaller(), core.WithLogger(slog.New(slog.DiscardHandler)),
		core.WithResolver(func(ctx context.Context, rec store.Record) (core.Resolution, error) {
			m, _ := structpb.NewStruct(map[string]any{"settled": "charge ch_1"}) // asked the provider with the downstream key
			resp, err := grpcidem.Response(m)
			return core.Resolution{Outcome: core.OutcomeApplied, Response: resp}, err
		}))
	if err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, e, func(ctx context.Context, method string, req *structpb.Struct) (*structpb.Struct, error) {
		_ = core.MarkEffect(ctx)
		return nil, status.Error(codes.Unavailable, "provider timed out")
	}, nil)
	ctx := ctxT(t)
	if r := h.Call(ctx, create, "acct_1", "k", nil); r.Code() != codes.Unavailable {
		t.Fatalf("first: %v", r)
	}
	r := h.Call(ctx, create, "acct_1", "k", nil)
	if r.Err != nil || !r.Replayed || r.Resp.AsMap()["settled"] != "charge ch_1" {
		t.Fatalf("after the resolver: %v, want its message replayed", r)
	}
	if n := h.Runs.Load(); n != 1 {
		t.Errorf("handler ran %d times, want 1", n)
	}
}
