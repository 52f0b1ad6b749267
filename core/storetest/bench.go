package storetest

import (
	"encoding/binary"
	"math/rand/v2"
	"sync/atomic"
	"testing"

	"github.com/idemkit/idem/core/store"
)

// Bench runs the benchmarks of the hot paths of a store, each as a
// sub-benchmark with a fresh store from newStore, serially and with
// b.RunParallel:
//
//   - ClaimComplete: Claim and Complete of a new identity (a first request);
//   - ClaimExisting: Claim of a completed identity (a replayed duplicate);
//   - Get: Get of a completed record with a 1 KiB response.
//
// A store's tests call it from a benchmark:
//
//	func BenchmarkStore(b *testing.B) {
//		storetest.Bench(b, func(b *testing.B) store.Store { return newStore(b) })
//	}
//
// newStore may be called more than once per sub-benchmark; the identities
// each call uses are random, so stores may share a database.
func Bench(b *testing.B, newStore func(b *testing.B) store.Store) {
	b.Run("ClaimComplete", func(b *testing.B) {
		s, ids := newStore(b), newBenchIDs()
		benchLoop(b, func() { claimComplete(b, s, ids.next()) })
	})
	b.Run("ClaimCompleteParallel", func(b *testing.B) {
		s, ids := newStore(b), newBenchIDs()
		benchParallel(b, func() { claimComplete(b, s, ids.next()) })
	})
	b.Run("ClaimExisting", func(b *testing.B) {
		s, ids := newStore(b), newBenchIDs()
		id := ids.next()
		claimComplete(b, s, id)
		req := benchRequest(id)
		benchLoop(b, func() { claimExisting(b, s, req) })
	})
	b.Run("ClaimExistingParallel", func(b *testing.B) {
		s, ids := newStore(b), newBenchIDs()
		id := ids.next()
		claimComplete(b, s, id)
		req := benchRequest(id)
		benchParallel(b, func() { claimExisting(b, s, req) })
	})
	b.Run("Get", func(b *testing.B) {
		s, ids := newStore(b), newBenchIDs()
		id := ids.next()
		claimComplete(b, s, id)
		benchLoop(b, func() { get(b, s, id) })
	})
	b.Run("GetParallel", func(b *testing.B) {
		s, ids := newStore(b), newBenchIDs()
		id := ids.next()
		claimComplete(b, s, id)
		benchParallel(b, func() { get(b, s, id) })
	})
}

func benchLoop(b *testing.B, op func()) {
	b.ReportAllocs()
	for b.Loop() {
		op()
	}
}

func benchParallel(b *testing.B, op func()) {
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			op()
		}
	})
}

// benchIDs hands out distinct IDs: a random prefix per benchmark run and a
// counter, written first so that the leading bytes vary too.
type benchIDs struct {
	salt uint64
	n    atomic.Uint64
}

func newBenchIDs() *benchIDs { return &benchIDs{salt: rand.Uint64()} }

func (g *benchIDs) next() store.ID {
	var id store.ID
	binary.LittleEndian.PutUint64(id[0:], g.n.Add(1))
	binary.LittleEndian.PutUint64(id[8:], g.salt)
	return id
}

var (
	benchClaim    = claimAt(store.ID{}, 1, at(0))
	benchResponse = make([]byte, 1024)
)

// benchRequest returns the benchmarks' claim of id, built without the cost
// of claimAt.
func benchRequest(id store.ID) store.ClaimRequest {
	req := benchClaim
	req.ID = id
	return req
}

// The operations fail with b.Error, which is safe from RunParallel's
// goroutines, and go on.

func claimComplete(b *testing.B, s store.Store, id store.ID) {
	ctx := b.Context()
	res, err := s.Claim(ctx, benchRequest(id))
	if err != nil || !res.Claimed {
		b.Errorf("Claim of a new identity = (Claimed %v, %v), want it claimed", res.Claimed, err)
		return
	}
	err = s.Complete(ctx, id, 1, store.Completion{
		State: store.StateCompleted, Status: 201, Response: benchResponse, ExpiresAt: at(retention),
	})
	if err != nil {
		b.Errorf("Complete: %v", err)
	}
}

func claimExisting(b *testing.B, s store.Store, req store.ClaimRequest) {
	res, err := s.Claim(b.Context(), req)
	if err != nil || res.Claimed {
		b.Errorf("Claim of a completed identity = (Claimed %v, %v), want the existing record", res.Claimed, err)
	}
}

func get(b *testing.B, s store.Store, id store.ID) {
	if _, err := s.Get(b.Context(), id, at(0)); err != nil {
		b.Errorf("Get: %v", err)
	}
}
