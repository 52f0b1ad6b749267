package sqltest

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
	"modernc.org/sqlite"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/grpcidem/internal/grpcidemtest"
	"github.com/idemkit/idem/sqlstore"
	"github.com/idemkit/idem/sqlstore/sqlstoretest"
)

var dialects = []sqlstore.Dialect{sqlstore.Postgres, sqlstore.MySQL, sqlstore.SQLite}

// openDB opens a pool on the dialect's test database (SQLite: a new file,
// as sqlstore's README recommends it) and closes it at cleanup.
func openDB(t *testing.T, d sqlstore.Dialect) *sql.DB {
	t.Helper()
	var (
		conn driver.Connector
		err  error
	)
	switch d {
	case sqlstore.Postgres:
		cfg, perr := pgx.ParseConfig(sqlstoretest.DSN(t, sqlstoretest.EnvPostgres))
		if perr != nil {
			t.Fatal(perr)
		}
		conn = stdlib.GetConnector(*cfg)
	case sqlstore.MySQL:
		cfg, perr := mysql.ParseDSN(sqlstoretest.DSN(t, sqlstoretest.EnvMySQL))
		if perr != nil {
			t.Fatal(perr)
		}
		conn, err = mysql.NewConnector(cfg)
	case sqlstore.SQLite:
		path := filepath.Join(t.TempDir(), "idem.db")
		conn, err = sqlite.NewConnector("file:" + path + "?_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)&_pragma=synchronous(NORMAL)&_txlock=immediate")
	}
	if err != nil {
		t.Fatal(err)
	}
	db := sql.OpenDB(conn)
	t.Cleanup(func() { db.Close() })
	if err := db.PingContext(context.Background()); err != nil {
		t.Fatalf("%v: %v", d, err)
	}
	return db
}

// fixture is an engine in atomic mode on a fresh sqlstore table, with a
// business table beside it.
type fixture struct {
	engine *core.Engine
	db     *sql.DB
	orders string
	ph     string // the dialect's first placeholder
}

func newFixture(t *testing.T, d sqlstore.Dialect) *fixture {
	db := openDB(t, d)
	table := sqlstoretest.Table()
	store, err := sqlstore.New(db, d, sqlstore.WithTable(table))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	f := &fixture{db: db, orders: table + "_orders", ph: "?"}
	if d == sqlstore.Postgres {
		f.ph = "$1"
	}
	if _, err := db.ExecContext(ctx, "CREATE TABLE "+f.orders+" (name VARCHAR(100) NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, tb := range []string{table, f.orders} {
			if _, err := db.ExecContext(context.Background(), "DROP TABLE IF EXISTS "+tb); err != nil {
				t.Errorf("drop %s: %v", tb, err)
			}
		}
	})
	if f.engine, err = core.New(store, core.WithSingleCaller()); err != nil {
		t.Fatal(err)
	}
	return f
}

// insert writes one business row in the call's transaction (sqlstore.Tx),
// as a handler would.
func (f *fixture) insert(ctx context.Context, name string) error {
	tx, err := sqlstore.Tx(ctx)
	if err != nil {
		return err
	}
	_, err = tx.ExecContext(ctx, "INSERT INTO "+f.orders+" (name) VALUES ("+f.ph+")", name)
	return err
}

func (f *fixture) count(t *testing.T, name string) int {
	t.Helper()
	var n int
	if err := f.db.QueryRowContext(context.Background(), "SELECT COUNT(*) FROM "+f.orders+" WHERE name = "+f.ph, name).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// failsafe bounds a wait that must end: shorter than ctxT's deadline, so
// the wait's own message wins over the call's DeadlineExceeded.
const failsafe = 10 * time.Second

// TestAtomic runs gRPC calls in atomic mode on each database: the claim,
// the handler's writes through sqlstore.Tx(ctx) and the recorded answer
// commit together, before the client gets the answer, exactly as over
// HTTP.
func TestAtomic(t *testing.T) {
	for _, d := range dialects {
		t.Run(d.String(), func(t *testing.T) {
			for _, tc := range []struct {
				name string
				fn   func(t *testing.T, f *fixture)
			}{
				{"CommitBeforeAnswer", commitBeforeAnswer},
				{"ServerErrorRollsBackAndReleases", serverErrorRollsBack},
				{"ClientErrorCommitsAndReplays", clientErrorCommits},
				{"PanicRollsBack", panicRollsBack},
				{"ConcurrentDuplicatesWriteOnce", concurrentDuplicates},
				{"CallerManagedTransaction", callerManaged},
			} {
				t.Run(tc.name, func(t *testing.T) { tc.fn(t, newFixture(t, d)) })
			}
		})
	}
}

// commitBeforeAnswer: when the client has the answer, the business row is
// committed; a duplicate replays it and writes nothing.
func commitBeforeAnswer(t *testing.T, f *fixture) {
	var s *grpcidemtest.Server
	s = grpcidemtest.New(t, f.engine, func(ctx context.Context, _ string, req *structpb.Struct) (*structpb.Struct, error) {
		if info, ok := core.AttemptFrom(ctx); !ok || !info.Atomic {
			t.Errorf("the handler runs outside an atomic attempt: %+v", info)
		}
		if err := f.insert(ctx, "tea"); err != nil {
			return nil, status.Error(codes.Internal, err.Error())
		}
		return structpb.NewStruct(map[string]any{"order": float64(s.Runs.Load())})
	}, nil)
	ctx := ctxT(t)
	first := s.Call(ctx, grpcidemtest.Create, "acct_1", "k1", map[string]any{"item": "tea"})
	if first.Err != nil {
		t.Fatal(first)
	}
	if n := f.count(t, "tea"); n != 1 {
		t.Fatalf("after the answer: %d rows, want 1 (committed before the answer)", n)
	}
	again := s.Call(ctx, grpcidemtest.Create, "acct_1", "k1", map[string]any{"item": "tea"})
	if again.Err != nil || !again.Replayed || !proto.Equal(again.Resp, first.Resp) {
		t.Fatalf("duplicate: %v, want %v replayed", again, first)
	}
	if n := f.count(t, "tea"); n != 1 || s.Runs.Load() != 1 {
		t.Fatalf("after the duplicate: %d rows, %d runs; want 1, 1", n, s.Runs.Load())
	}
}

// serverErrorRollsBack: a 5xx-class code (Unavailable) rolls the writes
// back and releases the key, so the retry runs and writes once.
func serverErrorRollsBack(t *testing.T, f *fixture) {
	var s *grpcidemtest.Server
	s = grpcidemtest.New(t, f.engine, func(ctx context.Context, _ string, req *structpb.Struct) (*structpb.Struct, error) {
		if err := f.insert(ctx, "tea"); err != nil {
			return nil, status.Error(codes.Internal, err.Error())
		}
		if s.Runs.Load() == 1 {
			return nil, status.Error(codes.Unavailable, "provider down")
		}
		return structpb.NewStruct(map[string]any{"ok": true})
	}, nil)
	ctx := ctxT(t)
	if r := s.Call(ctx, grpcidemtest.Create, "acct_1", "k1", map[string]any{"item": "tea"}); r.Code() != codes.Unavailable {
		t.Fatalf("first: %v, want the handler's Unavailable", r)
	}
	if n := f.count(t, "tea"); n != 0 {
		t.Fatalf("after Unavailable: %d rows, want 0 (rolled back)", n)
	}
	if r := s.Call(ctx, grpcidemtest.Create, "acct_1", "k1", map[string]any{"item": "tea"}); r.Err != nil || r.Replayed {
		t.Fatalf("retry: %v, want a new execution", r)
	}
	if n := f.count(t, "tea"); n != 1 {
		t.Fatalf("after the retry: %d rows, want 1", n)
	}
}

// clientErrorCommits: a client error (FailedPrecondition, HTTP 412) is an
// answer: recorded with the handler's writes, and replayed.
func clientErrorCommits(t *testing.T, f *fixture) {
	s := grpcidemtest.New(t, f.engine, func(ctx context.Context, _ string, req *structpb.Struct) (*structpb.Struct, error) {
		if err := f.insert(ctx, "audit"); err != nil {
			return nil, status.Error(codes.Internal, err.Error())
		}
		return nil, status.Error(codes.FailedPrecondition, "account frozen")
	}, nil)
	ctx := ctxT(t)
	for i := range 2 {
		r := s.Call(ctx, grpcidemtest.Create, "acct_1", "k1", map[string]any{"item": "tea"})
		if r.Code() != codes.FailedPrecondition || status.Convert(r.Err).Message() != "account frozen" || r.Replayed != (i == 1) {
			t.Fatalf("call %d: %v, want the handler's FailedPrecondition (replayed %v)", i+1, r, i == 1)
		}
	}
	if n := f.count(t, "audit"); n != 1 || s.Runs.Load() != 1 {
		t.Fatalf("%d rows, %d runs; want 1, 1", n, s.Runs.Load())
	}
}

// panicRollsBack: a panic rolls the writes back and releases the key.
func panicRollsBack(t *testing.T, f *fixture) {
	recovery := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (resp any, err error) {
		defer func() {
			if v := recover(); v != nil {
				resp, err = nil, status.Errorf(codes.Internal, "panic: %v", v)
			}
		}()
		return handler(ctx, req)
	}
	var s *grpcidemtest.Server
	s = grpcidemtest.New(t, f.engine, func(ctx context.Context, _ string, req *structpb.Struct) (*structpb.Struct, error) {
		if err := f.insert(ctx, "tea"); err != nil {
			return nil, status.Error(codes.Internal, err.Error())
		}
		if s.Runs.Load() == 1 {
			panic("boom")
		}
		return structpb.NewStruct(map[string]any{"ok": true})
	}, nil, recovery)
	ctx := ctxT(t)
	if r := s.Call(ctx, grpcidemtest.Create, "acct_1", "k1", map[string]any{"item": "tea"}); r.Code() != codes.Internal {
		t.Fatalf("first: %v, want Internal from the recovery", r)
	}
	if n := f.count(t, "tea"); n != 0 {
		t.Fatalf("after the panic: %d rows, want 0", n)
	}
	if r := s.Call(ctx, grpcidemtest.Create, "acct_1", "k1", map[string]any{"item": "tea"}); r.Err != nil || r.Replayed {
		t.Fatalf("retry: %v, want a new execution", r)
	}
	if n := f.count(t, "tea"); n != 1 {
		t.Fatalf("after the retry: %d rows, want 1", n)
	}
}

// concurrentDuplicates: concurrent calls with one key, while the first
// holds its transaction open, write one row; the others are refused in
// progress (Aborted) or, where the database makes them wait (SQLite),
// replay the one answer.
func concurrentDuplicates(t *testing.T, f *fixture) {
	entered, gate := make(chan struct{}), make(chan struct{})
	var once sync.Once
	var s *grpcidemtest.Server
	s = grpcidemtest.New(t, f.engine, func(ctx context.Context, _ string, req *structpb.Struct) (*structpb.Struct, error) {
		if err := f.insert(ctx, "tea"); err != nil {
			return nil, status.Error(codes.Internal, err.Error())
		}
		once.Do(func() { close(entered) })
		<-gate
		return structpb.NewStruct(map[string]any{"order": float64(s.Runs.Load())})
	}, nil)
	// Registered after the fixture's and the server's cleanups, so it runs
	// first: a handler held with its transaction open would block the
	// fixture's DROP.
	open := sync.OnceFunc(func() { close(gate) })
	t.Cleanup(open)
	ctx := ctxT(t)
	first := make(chan grpcidemtest.Reply, 1)
	go func() { first <- s.Call(ctx, grpcidemtest.Create, "acct_1", "k1", map[string]any{"item": "tea"}) }()
	select {
	case <-entered:
	case r := <-first:
		t.Fatalf("the first call answered before its handler wrote: %v", r)
	case <-time.After(failsafe):
		t.Fatalf("the first call's handler did not write within %v", failsafe)
	}
	const dups = 6
	var wg sync.WaitGroup
	var refused atomic.Int64
	replies := make([]grpcidemtest.Reply, dups)
	for i := range dups {
		wg.Add(1)
		go func() {
			defer wg.Done()
			replies[i] = s.Call(ctx, grpcidemtest.Create, "acct_1", "k1", map[string]any{"item": "tea"})
			if replies[i].Code() == codes.Aborted {
				refused.Add(1)
			}
		}()
	}
	if f.engine.Store().(*sqlstore.Store).Dialect() != sqlstore.SQLite {
		wg.Wait() // refused at once, while the first still holds its transaction
		if refused.Load() != dups {
			t.Errorf("%d of %d duplicates refused while the first ran: %v", refused.Load(), dups, replies)
		}
	}
	open()
	wg.Wait()
	r := <-first
	if r.Err != nil {
		t.Fatal(r)
	}
	for _, d := range replies {
		if d.Code() != codes.Aborted && (d.Err != nil || !d.Replayed || !proto.Equal(d.Resp, r.Resp)) {
			t.Errorf("duplicate: %v, want Aborted or %v replayed", d, r)
		}
	}
	if n := f.count(t, "tea"); n != 1 || s.Runs.Load() != 1 {
		t.Fatalf("%d rows, %d runs; want 1, 1", n, s.Runs.Load())
	}
	if _, delay := replies[0].Reason(); replies[0].Code() == codes.Aborted && delay <= 0 {
		t.Errorf("in progress without a retry delay: %v", replies[0])
	}
}

// callerManaged: a service whose own interceptor opens the transaction
// (sqlstore.WithTx) gets the claim, the handler's writes and the record in
// it: the interceptor commits them together; a duplicate replays and writes
// nothing; when the service rolls back, nothing of the call persists and
// the retry runs.
func callerManaged(t *testing.T, f *fixture) {
	rollback := true
	txPerCall := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		tx, err := f.db.BeginTx(ctx, nil)
		if err != nil {
			return nil, status.Error(codes.Unavailable, err.Error())
		}
		resp, err := handler(sqlstore.WithTx(ctx, tx), req)
		if err != nil || rollback {
			_ = tx.Rollback()
			if err == nil {
				err = status.Error(codes.Unavailable, "rolled back by the service")
			}
			return nil, err
		}
		if err := tx.Commit(); err != nil {
			return nil, status.Error(codes.Unavailable, err.Error())
		}
		return resp, nil
	}
	var s *grpcidemtest.Server
	s = grpcidemtest.New(t, f.engine, func(ctx context.Context, _ string, req *structpb.Struct) (*structpb.Struct, error) {
		if err := f.insert(ctx, "tea"); err != nil {
			return nil, status.Error(codes.Internal, err.Error())
		}
		return structpb.NewStruct(map[string]any{"order": float64(s.Runs.Load())})
	}, nil, txPerCall)
	ctx := ctxT(t)
	if r := s.Call(ctx, grpcidemtest.Create, "acct_1", "k1", map[string]any{"item": "tea"}); r.Code() != codes.Unavailable {
		t.Fatalf("rolled back: %v", r)
	}
	if n := f.count(t, "tea"); n != 0 {
		t.Fatalf("after the service's rollback: %d rows, want 0", n)
	}
	rollback = false
	first := s.Call(ctx, grpcidemtest.Create, "acct_1", "k1", map[string]any{"item": "tea"})
	if first.Err != nil || first.Replayed {
		t.Fatalf("retry: %v, want a new execution", first)
	}
	again := s.Call(ctx, grpcidemtest.Create, "acct_1", "k1", map[string]any{"item": "tea"})
	if again.Err != nil || !again.Replayed || !proto.Equal(again.Resp, first.Resp) {
		t.Fatalf("duplicate: %v, want %v replayed", again, first)
	}
	if n := f.count(t, "tea"); n != 1 || s.Runs.Load() != 2 {
		t.Fatalf("%d rows, %d runs; want 1, 2", n, s.Runs.Load())
	}
}
