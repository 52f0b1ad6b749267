package redistest

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/grpcidem"
)

// TestGRPC: grpcidem over Redis: a duplicate call replays the first
// answer, and a storm of concurrent calls with one key runs the handler
// once (every other call is refused in progress or replays it). The
// interceptor is called as a grpc.Server calls it (grpcidem's own tests
// serve it on one, over the memory store and the SQL stores).
func TestGRPC(t *testing.T) {
	e, err := core.New(newStore(t, client(t)), core.WithSingleCaller())
	if err != nil {
		t.Fatal(err)
	}
	in, err := grpcidem.UnaryServerInterceptor(e, grpcidem.WithSingleCaller())
	if err != nil {
		t.Fatal(err)
	}
	var runs atomic.Int64
	handler := func(ctx context.Context, _ any) (any, error) {
		n := runs.Add(1)
		time.Sleep(20 * time.Millisecond) // long enough for the storm to overlap
		return structpb.NewStruct(map[string]any{"order": float64(n)})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	call := func(key string) grpcReply {
		req, err := structpb.NewStruct(map[string]any{"item": "tea"})
		if err != nil {
			t.Fatal(err)
		}
		st := &headerStream{}
		cctx := grpc.NewContextWithServerTransportStream(metadata.NewIncomingContext(ctx, metadata.Pairs(grpcidem.MetadataKey, key)), st)
		out, err := in(cctx, req, &grpc.UnaryServerInfo{FullMethod: "/test.Orders/Create"}, handler)
		r := grpcReply{err: err, replayed: slices.Equal(st.header.Get(grpcidem.MetadataReplayed), []string{"true"})}
		r.resp, _ = out.(*structpb.Struct)
		return r
	}
	first, again := call("k1"), call("k1")
	if first.err != nil || first.replayed || again.err != nil || !again.replayed || !proto.Equal(first.resp, again.resp) {
		t.Fatalf("first %+v, again %+v: want the first answer replayed", first, again)
	}
	const n = 16
	replies := make([]grpcReply, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-start
			replies[i] = call("storm")
		})
	}
	close(start)
	wg.Wait()
	if runs := runs.Load(); runs != 2 {
		t.Fatalf("handler ran %d times for two keys, want 2", runs)
	}
	for _, r := range replies {
		if r.err != nil && status.Code(r.err) != codes.Aborted || r.err == nil && r.resp.AsMap()["order"] != float64(2) {
			t.Errorf("storm reply %+v", r)
		}
	}
}

// grpcReply is what a call of TestGRPC got.
type grpcReply struct {
	resp     *structpb.Struct
	err      error
	replayed bool // the idempotent-replayed header was "true"
}

// headerStream is the server stream a call's context carries: it keeps
// the header metadata the interceptor sets.
type headerStream struct {
	mu     sync.Mutex
	header metadata.MD
}

func (s *headerStream) Method() string { return "/test.Orders/Create" }

func (s *headerStream) SetHeader(md metadata.MD) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.header = metadata.Join(s.header, md)
	return nil
}

func (s *headerStream) SendHeader(md metadata.MD) error { return s.SetHeader(md) }

func (s *headerStream) SetTrailer(metadata.MD) error { return nil }

// TestOnce: Engine.Once over Redis: a redelivered message returns the
// first run's value without running again, also when redeliveries race.
func TestOnce(t *testing.T) {
	e, err := core.New(newStore(t, client(t)), core.WithSingleCaller())
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	var (
		mu   sync.Mutex
		runs int
	)
	fn := func(context.Context) ([]byte, error) {
		mu.Lock()
		runs++
		mu.Unlock()
		time.Sleep(20 * time.Millisecond)
		return []byte("charged"), nil
	}
	m := core.Message{Consumer: "billing", ID: "m1"}
	first, err := e.Once(ctx, m, fn)
	if err != nil || first.Replayed || string(first.Value) != "charged" {
		t.Fatalf("first delivery: %+v %v", first, err)
	}
	again, err := e.Once(ctx, m, fn)
	if err != nil || !again.Replayed || string(again.Value) != "charged" {
		t.Fatalf("redelivery: %+v %v, want the first value replayed", again, err)
	}
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() { _, _ = e.Once(ctx, core.Message{Consumer: "billing", ID: "m2"}, fn) })
	}
	wg.Wait()
	if runs != 2 {
		t.Fatalf("the function ran %d times for two messages, want 2", runs)
	}
}
