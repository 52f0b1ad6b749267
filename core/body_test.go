package core

import (
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"runtime"
	"testing"
)

// trickle is a request body that delivers sent bytes, chunk bytes per
// Read, then fails as a server's body reader does on a short body.
type trickle struct {
	sent, chunk int
	err         error
}

func (b *trickle) Read(p []byte) (int, error) {
	if b.sent == 0 {
		return 0, b.err
	}
	n := min(len(p), b.chunk, b.sent)
	for i := range p[:n] {
		p[i] = 'x'
	}
	b.sent -= n
	return n, nil
}

func (b *trickle) Close() error { return nil }

// TestBodyBufferFollowsBytesReceived: the buffer that reads the request
// body grows with the bytes that arrive, never from the declared
// Content-Length (docs/contract.md, section 2 "Fingerprint"): a client
// that declares 1 MiB and sends 5 bytes costs a few KiB, not 1 MiB; a
// whole body is still read in a few allocations of at most about twice
// its size, and never beyond the limit.
func TestBodyBufferFollowsBytesReceived(t *testing.T) {
	const MiB = 1 << 20
	for _, tt := range []struct {
		name           string
		declared       int64 // -1: unknown
		sent, chunk    int
		err            error
		wantErr        bool
		maxBytes       uint64 // allocated by load
		maxAllocations uint64
	}{
		{"nok, 1 MiB declared, 5 bytes sent", MiB, 5, 5, io.ErrUnexpectedEOF, true, 8 << 10, 12},
		{"nok, 1 MiB declared, 64 KiB sent", MiB, 64 << 10, 4 << 10, io.ErrUnexpectedEOF, true, 4*64<<10 + 8<<10, 16},
		{"ok, 1 MiB declared and sent", MiB, MiB, 32 << 10, io.EOF, false, 5 * MiB / 2, 12},
		{"ok, 1 MiB sent without a length", -1, MiB, 32 << 10, io.EOF, false, 5 * MiB / 2, 14},
		{"ok, 300 bytes declared and sent: one allocation", 300, 300, 300, io.EOF, false, 512, 1},
		{"ok, 4 KiB declared and sent: one allocation", 4 << 10, 4 << 10, 4 << 10, io.EOF, false, 4 << 10, 1},
		{"nok, 4 MiB sent without a length, limit 1 MiB", -1, 4 * MiB, 32 << 10, io.EOF, true, 5 * MiB / 2, 24},
		{"ok, 2 KiB sent, 1 KiB declared (a replaced body): read whole", 1 << 10, 2 << 10, 512, io.EOF, false, 16 << 10, 8},
		{"nok, 4 MiB sent, 1 KiB declared, limit 1 MiB", 1 << 10, 4 * MiB, 32 << 10, io.EOF, true, 5 * MiB / 2, 24},
	} {
		t.Run(tt.name, func(t *testing.T) {
			// The least of three runs: the runtime's own allocations (a
			// GC cycle, another goroutine) only ever add to the count.
			var got []byte
			var err error
			var received int
			bytes, mallocs := uint64(math.MaxUint64), uint64(math.MaxUint64)
			for range 3 {
				r := httptest.NewRequest(http.MethodPost, "/orders", nil)
				r.ContentLength = tt.declared
				body := &trickle{sent: tt.sent, chunk: tt.chunk, err: tt.err}
				r.Body = body
				var b bodyReader
				var m0, m1 runtime.MemStats
				runtime.ReadMemStats(&m0)
				got, err = b.load(r, MiB)
				runtime.ReadMemStats(&m1)
				bytes, mallocs = min(bytes, m1.TotalAlloc-m0.TotalAlloc), min(mallocs, m1.Mallocs-m0.Mallocs)
				received = tt.sent - body.sent
			}
			if (err != nil) != tt.wantErr {
				t.Fatalf("load: %v, want an error: %v", err, tt.wantErr)
			}
			if err == nil && len(got) != tt.sent {
				t.Fatalf("load read %d bytes, want %d", len(got), tt.sent)
			}
			t.Logf("%d bytes received, %d bytes in %d allocations", received, bytes, mallocs)
			if bytes > tt.maxBytes {
				t.Errorf("load allocated %d bytes for %d bytes received (declared %d), want at most %d", bytes, received, tt.declared, tt.maxBytes)
			}
			if mallocs > tt.maxAllocations {
				t.Errorf("load made %d allocations, want at most %d", mallocs, tt.maxAllocations)
			}
		})
	}
}
