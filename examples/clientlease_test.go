package examples_test

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/memstore"
	"github.com/idemkit/idem/core/store"
	"github.com/idemkit/idem/idemclient"
)

// TestDefaultClientOutlastsADeadLease: a default idemclient pays through a
// leased route (default lease, 30 s). The process running the payment
// dies inside the handler (its connections are cut, its lease is no
// longer extended); for 5 s every connection is refused; then a new
// process serves the same store. The client retries through the restart,
// through the 409s while the dead attempt's lease runs (told when it
// lapses once nobody extends it, instead of polling every second to the
// end), and gets the answer of the attempt that takes the lease over:
// attempt 2, with the client's one key and the first attempt's downstream
// key.
//
// Everything runs in a testing/synctest bubble (the lease, the backoff and
// Retry-After pass in virtual time) over in-memory connections (net.Pipe)
// between a real http.Transport and real http.Servers.
func TestDefaultClientOutlastsADeadLease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := memstore.New()
		quiet := core.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil)))
		nw := &network{}
		rec := &recorder{}
		downstream := make(chan string, 2)

		// Process 1: runs the payment and dies inside it.
		dying := &dyingStore{Store: st}
		e1, err := core.New(dying, core.WithSingleCaller(), quiet)
		if err != nil {
			t.Fatal(err)
		}
		inside := make(chan struct{})
		gone := make(chan struct{})
		srv1 := nw.serve(rec.wrap(e1.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			k, _ := core.DownstreamKey(r.Context(), "charge")
			downstream <- k
			close(inside)
			<-gone // the process is dead: this goroutine never runs again
		}), core.Scope("pay"))))

		// The client: idemclient with its defaults, over the network.
		base := &http.Transport{DialContext: nw.dial}
		tr, err := idemclient.NewTransport(base)
		if err != nil {
			t.Fatal(err)
		}
		type result struct {
			resp *http.Response
			body string
			err  error
		}
		done := make(chan result, 1)
		start := time.Now()
		go func() {
			req, _ := http.NewRequest(http.MethodPost, "http://pay.test/payments", strings.NewReader(`{"amount_cents":4200}`))
			resp, err := (&http.Client{Transport: tr}).Do(req)
			if err != nil {
				done <- result{err: err}
				return
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			done <- result{resp: resp, body: string(b)}
		}()
		<-inside
		dying.dead.Store(true) // the crash: no more extensions ...
		nw.down()              // ... no more listener ...
		srv1.Close()           // ... and the attempt's connection is cut

		time.Sleep(5 * time.Second) // the restart: every connection refused
		e2, err := core.New(st, core.WithSingleCaller(), quiet)
		if err != nil {
			t.Fatal(err)
		}
		srv2 := nw.serve(rec.wrap(e2.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			info, _ := core.AttemptFrom(r.Context())
			k, _ := core.DownstreamKey(r.Context(), "charge")
			downstream <- k
			w.WriteHeader(http.StatusCreated)
			io.WriteString(w, "charged by attempt "+strconv.Itoa(info.Attempt))
		}), core.Scope("pay"))))

		r := <-done
		elapsed := time.Since(start)
		srv2.Close()
		base.CloseIdleConnections()
		close(gone)

		if r.err != nil {
			t.Fatalf("the default client gave up after %s: %v\n%s", elapsed, r.err, rec)
		}
		if r.resp.StatusCode != http.StatusCreated || r.body != "charged by attempt 2" || idemclient.Replayed(r.resp) {
			t.Fatalf("the client ended with %d %q (replayed %v) after %s, want the takeover's 201\n%s", r.resp.StatusCode, r.body, idemclient.Replayed(r.resp), elapsed, rec)
		}
		if first, second := <-downstream, <-downstream; first == "" || first != second {
			t.Errorf("downstream keys %q and %q: the takeover must repeat the charge with the first attempt's key", first, second)
		}
		keys, busy, longest := rec.summary()
		if len(keys) != 1 || keys[0] != idemclient.Key(r.resp) {
			t.Errorf("the servers saw keys %q, the client's answer %q: want one key", keys, idemclient.Key(r.resp))
		}
		if elapsed < core.DefaultLease || elapsed > idemclient.DefaultMaxElapsed {
			t.Errorf("answered after %s, want after the lease (%s) and within the client's budget (%s)", elapsed, core.DefaultLease, idemclient.DefaultMaxElapsed)
		}
		// Polling every second from the restart to the lapse would be 25
		// 409s; told when the lease lapses, the client asks about half as
		// often.
		if busy > 16 || longest < 10*time.Second {
			t.Errorf("%d 409s, the longest Retry-After %s: want the lease's lapse said once nobody extends it, not a poll every second\n%s", busy, longest, rec)
		}
		t.Logf("answered after %s (%d attempts, %d 409s, the longest Retry-After %s)", elapsed.Round(time.Millisecond), idemclient.Attempts(r.resp), busy, longest)
	})
}

// dyingStore is process 1's view of the store: once dead, its lease
// extensions fail (the process is gone; its heartbeat would never run).
type dyingStore struct {
	store.Store
	dead atomic.Bool
}

func (s *dyingStore) Extend(ctx context.Context, id store.ID, token int64, until time.Time) error {
	if s.dead.Load() {
		return core.ErrStoreUnavailable
	}
	return s.Store.Extend(ctx, id, token, until)
}

// network connects the client to the process listening now, over
// net.Pipe (which a synctest bubble can wait on), and refuses connections
// while none listens.
type network struct {
	mu sync.Mutex
	ln *pipeListener
}

func (n *network) serve(h http.Handler) *http.Server {
	ln := &pipeListener{conns: make(chan net.Conn), closed: make(chan struct{})}
	n.mu.Lock()
	n.ln = ln
	n.mu.Unlock()
	srv := &http.Server{Handler: h}
	go func() { _ = srv.Serve(ln) }()
	return srv
}

func (n *network) down() {
	n.mu.Lock()
	n.ln = nil
	n.mu.Unlock()
}

func (n *network) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	n.mu.Lock()
	ln := n.ln
	n.mu.Unlock()
	refused := &net.OpError{Op: "dial", Net: network, Err: syscall.ECONNREFUSED}
	if ln == nil {
		return nil, refused
	}
	client, server := net.Pipe()
	select {
	case ln.conns <- server:
		return client, nil
	case <-ln.closed:
		return nil, refused
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

type pipeListener struct {
	conns  chan net.Conn
	closed chan struct{}
	once   sync.Once
}

func (l *pipeListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.closed:
		return nil, net.ErrClosed
	}
}

func (l *pipeListener) Close() error {
	l.once.Do(func() { close(l.closed) })
	return nil
}

func (l *pipeListener) Addr() net.Addr { return pipeAddr{} }

type pipeAddr struct{}

func (pipeAddr) Network() string { return "pipe" }
func (pipeAddr) String() string  { return "pay.test:80" }

// recorder keeps what the servers answered, in virtual time.
type recorder struct {
	mu    sync.Mutex
	start time.Time
	lines []string
	keys  []string
	busy  int
	wait  time.Duration // the longest Retry-After of a 409
}

func (rc *recorder) wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get(core.HeaderKey)
		rc.mu.Lock()
		if rc.start.IsZero() {
			rc.start = time.Now()
		}
		if !slices.Contains(rc.keys, key) {
			rc.keys = append(rc.keys, key)
		}
		rc.mu.Unlock()
		cw := &codeWriter{ResponseWriter: w}
		h.ServeHTTP(cw, r)
		rc.mu.Lock()
		defer rc.mu.Unlock()
		ra := w.Header().Get("Retry-After")
		if cw.code == http.StatusConflict {
			rc.busy++
			if s, err := strconv.Atoi(ra); err == nil {
				rc.wait = max(rc.wait, time.Duration(s)*time.Second)
			}
		}
		rc.lines = append(rc.lines, time.Since(rc.start).String()+": "+strconv.Itoa(cw.code)+" Retry-After "+ra)
	})
}

func (rc *recorder) summary() (keys []string, busy int, longest time.Duration) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return append([]string(nil), rc.keys...), rc.busy, rc.wait
}

func (rc *recorder) String() string {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return "answers:\n" + strings.Join(rc.lines, "\n")
}

type codeWriter struct {
	http.ResponseWriter
	code int
}

func (w *codeWriter) WriteHeader(code int) {
	if w.code == 0 {
		w.code = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *codeWriter) Write(b []byte) (int, error) {
	if w.code == 0 {
		w.code = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}
