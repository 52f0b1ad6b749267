package redistest

import (
	"context"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/grpcidem/grpcidemtest"
)

// TestGRPC: grpcidem over Redis: a duplicate call replays the first
// answer, and a storm of concurrent calls with one key runs the handler
// once (every other call is refused in progress or replays it).
func TestGRPC(t *testing.T) {
	e, err := core.New(newStore(t, client(t)), core.WithSingleCaller())
	if err != nil {
		t.Fatal(err)
	}
	var srv *grpcidemtest.Server
	srv = grpcidemtest.New(t, e, func(ctx context.Context, method string, req *structpb.Struct) (*structpb.Struct, error) {
		time.Sleep(20 * time.Millisecond) // long enough for the storm to overlap
		return structpb.NewStruct(map[string]any{"order": float64(srv.Runs.Load())})
	}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	first := srv.Call(ctx, grpcidemtest.Create, "acct_1", "k1", map[string]any{"item": "tea"})
	again := srv.Call(ctx, grpcidemtest.Create, "acct_1", "k1", map[string]any{"item": "tea"})
	if first.Err != nil || first.Replayed || again.Err != nil || !again.Replayed || !proto.Equal(first.Resp, again.Resp) {
		t.Fatalf("first %v, again %v: want the first answer replayed", first, again)
	}
	const n = 16
	replies := make([]grpcidemtest.Reply, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-start
			replies[i] = srv.Call(ctx, grpcidemtest.Create, "acct_1", "storm", map[string]any{"item": "tea"})
		})
	}
	close(start)
	wg.Wait()
	if runs := srv.Runs.Load(); runs != 2 {
		t.Fatalf("handler ran %d times for two keys, want 2", runs)
	}
	for _, r := range replies {
		if r.Err != nil && r.Code() != codes.Aborted || r.Err == nil && r.Resp.AsMap()["order"] != float64(2) {
			t.Errorf("storm reply %v", r)
		}
	}
}

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
