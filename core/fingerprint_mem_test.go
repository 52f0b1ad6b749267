package core

import (
	"github.com/idemkit/idem/internal/canonjson"

	"fmt"
	"runtime"
	"strings"
	"testing"
)

// maxFingerprintBytesPerByte is the bound the memory test asserts: bytes
// allocated by one fingerprint per byte of a 1 MiB body. The design bound
// is 2.4 (12 bytes of bookkeeping per object member, a member takes at
// least 5 bytes); the rest is headroom.
const maxFingerprintBytesPerByte = 3.0

// hostileBodies are JSON documents of about size bytes shaped to make a
// canonicaliser allocate: many objects out of order, deep nesting, many
// tiny members, many numbers, empty containers,
// escaped strings.
func hostileBodies(size int) map[string][]byte {
	fill := func(open, unit, close string) []byte {
		var b strings.Builder
		b.WriteString(open)
		for i := 0; b.Len()+len(unit)+len(close)+1 < size; i++ {
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteString(strings.ReplaceAll(unit, "#", fmt.Sprint(i)))
		}
		b.WriteString(close)
		return []byte(b.String())
	}
	return map[string][]byte{
		"UnsortedObjects": fill("[", `{"b":1,"a":2}`, "]"),
		"UnsortedDeep":    fill("[", strings.Repeat(`{"b":0,"a":`, 127)+"0"+strings.Repeat("}", 127), "]"),
		"NestedEmptyName": fill("[", strings.Repeat(`{"":`, 127)+"0"+strings.Repeat("}", 127), "]"),
		"TinyMembers":     fill("{", `"#":0`, "}"),
		"TinyMembersDesc": tinyMembersDescending(size),
		"CollidingNames":  fill("[", `{"b":1,"B":2,"a":0,"A":1}`, "]"),
		"Numbers":         fill("[", `1e20`, "]"),
		"EmptyObjects":    fill("[", `{}`, "]"),
		"EmptyArrays":     fill("[", `[]`, "]"),
		"Escapes":         fill("[", `{"\u0062":"\u00e9\ud83d\ude00","\u0061":"\n"}`, "]"),
	}
}

// tinyMembersDescending is an object of about size bytes whose members
// come in reverse order.
func tinyMembersDescending(size int) []byte {
	n := size / 10
	var b strings.Builder
	b.WriteByte('{')
	for i := n; i > 0; i-- {
		fmt.Fprintf(&b, `"%07d":0`, i)
		if i > 1 {
			b.WriteByte(',')
		}
	}
	b.WriteByte('}')
	return []byte(b.String())
}

// allocated returns the bytes f allocates, from the runtime's count (one
// goroutine, so the count is f's own, give or take the runtime's noise).
func allocated(f func()) uint64 {
	runtime.GC()
	runtime.GC() // the pool is emptied: f starts from nothing
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// TestFingerprintMemory: a hostile body makes the fingerprint allocate at
// most a small multiple of its size (docs/contract.md, section 2 "Fingerprint"), whatever its
// shape; DefaultFingerprint and FingerprintFields alike.
func TestFingerprintMemory(t *testing.T) {
	r := newRequest("application/json")
	fields := FingerprintFields("a", "b", "0", "1")
	for name, body := range hostileBodies(1 << 20) {
		t.Run(name, func(t *testing.T) {
			if _, err := canonjson.Append(nil, body); err != nil {
				t.Fatalf("the body is not canonical JSON: %v", err)
			}
			for _, f := range []struct {
				name string
				fp   Fingerprinter
			}{{"DefaultFingerprint", DefaultFingerprint}, {"FingerprintFields", fields}} {
				n := allocated(func() { _, _ = f.fp(r, "POST /orders", body) })
				perByte := float64(n) / float64(len(body))
				t.Logf("%s: %d bytes allocated for %d bytes of body: %.2f per byte", f.name, n, len(body), perByte)
				if perByte > maxFingerprintBytesPerByte {
					t.Errorf("%s allocates %.2f bytes per body byte, want at most %.1f", f.name, perByte, maxFingerprintBytesPerByte)
				}
			}
		})
	}
}

// BenchmarkFingerprintHostile reports the bytes allocated per body byte
// (B/body-byte) of DefaultFingerprint on the hostile 1 MiB bodies.
func BenchmarkFingerprintHostile(b *testing.B) {
	r := newRequest("application/json")
	for name, body := range hostileBodies(1 << 20) {
		b.Run(name, func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			for b.Loop() {
				_, _ = DefaultFingerprint(r, "POST /orders", body)
			}
			runtime.ReadMemStats(&after)
			b.ReportMetric(float64(after.TotalAlloc-before.TotalAlloc)/float64(b.N)/float64(len(body)), "B/body-byte")
		})
	}
}
