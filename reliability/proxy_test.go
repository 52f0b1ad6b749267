package reliability

import (
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// faultProxy is a TCP proxy between a database client and its server, on
// loopback, that injects faults: latency on every chunk, cutting every
// connection at once, cutting one connection after a number of bytes
// (mid-statement, mid-transaction), and cutting a connection when the
// client sends COMMIT, either before the server gets it (the transaction
// rolls back) or just after (it commits, and the client never hears so).
type faultProxy struct {
	ln     net.Listener
	target string
	dsn    string // Postgres: the test DSN pointed at the proxy

	maxLatency atomic.Int64 // ns; each chunk waits a random time up to this
	cutBytes   atomic.Int64 // > 0: the next connection to send data is cut after that many bytes
	cutCommit  atomic.Int32 // 1: cut before forwarding the next COMMIT; 2: just after

	mu    sync.Mutex
	conns map[*proxyConn]struct{}
	wg    sync.WaitGroup

	cuts, commitCuts, commits atomic.Int64
}

type proxyConn struct {
	client, server net.Conn
	once           sync.Once
}

func (c *proxyConn) close() {
	c.once.Do(func() {
		c.client.Close()
		c.server.Close()
	})
}

// newFaultProxy listens on 127.0.0.1:0 and forwards to target; it is
// closed at cleanup.
func newFaultProxy(t testing.TB, target string) *faultProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &faultProxy{ln: ln, target: target, conns: map[*proxyConn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

// Addr is the proxy's host:port.
func (p *faultProxy) Addr() string { return p.ln.Addr().String() }

func (p *faultProxy) close() {
	p.ln.Close()
	p.cutAll()
	p.wg.Wait()
}

func (p *faultProxy) accept() {
	defer p.wg.Done()
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		server, err := net.DialTimeout("tcp", p.target, 5*time.Second)
		if err != nil {
			client.Close()
			continue
		}
		c := &proxyConn{client: client, server: server}
		p.mu.Lock()
		p.conns[c] = struct{}{}
		p.mu.Unlock()
		p.wg.Add(2)
		go p.pipe(c, client, server, true)
		go p.pipe(c, server, client, false)
	}
}

// cutAll closes every open connection, both ways.
func (p *faultProxy) cutAll() {
	p.mu.Lock()
	conns := make([]*proxyConn, 0, len(p.conns))
	for c := range p.conns {
		conns = append(conns, c)
	}
	p.mu.Unlock()
	for _, c := range conns {
		c.close()
	}
	p.cuts.Add(int64(len(conns)))
}

func (p *faultProxy) drop(c *proxyConn) {
	c.close()
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
}

var commitWord = []byte("commit")

func (p *faultProxy) pipe(c *proxyConn, from, to net.Conn, upstream bool) {
	defer p.wg.Done()
	defer p.drop(c)
	buf := make([]byte, 32<<10)
	rng := rand.New(rand.NewPCG(rand.Uint64(), 0))
	for {
		n, err := from.Read(buf)
		if n > 0 {
			chunk := buf[:n]
			if d := p.maxLatency.Load(); d > 0 {
				time.Sleep(time.Duration(rng.Int64N(d)))
			}
			if upstream {
				commit := bytes.Contains(bytes.ToLower(chunk), commitWord)
				if commit {
					p.commits.Add(1)
				}
				if mode := p.cutCommit.Load(); mode != 0 && commit && p.cutCommit.CompareAndSwap(mode, 0) {
					p.commitCuts.Add(1)
					if mode == 2 {
						_, _ = to.Write(chunk)
						time.Sleep(5 * time.Millisecond) // let the server commit
					}
					return
				}
				if cut := p.countDown(len(chunk)); cut >= 0 {
					_, _ = to.Write(chunk[:cut])
					p.cuts.Add(1)
					return
				}
			}
			if _, werr := to.Write(chunk); werr != nil {
				return
			}
		}
		if err != nil {
			if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
				_ = err // a reset: the other side is gone
			}
			return
		}
	}
}

// countDown takes n bytes off the armed byte budget: it returns how many
// of them to forward before cutting, or -1 to forward all (not armed, or
// the budget lasts).
func (p *faultProxy) countDown(n int) int {
	for {
		left := p.cutBytes.Load()
		switch {
		case left <= 0:
			return -1
		case int64(n) < left:
			if p.cutBytes.CompareAndSwap(left, left-int64(n)) {
				return -1
			}
		default:
			if p.cutBytes.CompareAndSwap(left, 0) {
				return int(left)
			}
		}
	}
}
