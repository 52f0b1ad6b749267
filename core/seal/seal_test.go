package seal

import (
	"bytes"
	"crypto/rand"
	"testing"

	"github.com/idemkit/idem/core/store"
)

func TestAESGCM(t *testing.T) {
	k1, k2 := make([]byte, 32), make([]byte, 32)
	rand.Read(k1)
	rand.Read(k2)
	old, err := NewAESGCM(map[string][]byte{"k1": k1}, "k1")
	if err != nil {
		t.Fatal(err)
	}
	id := store.Identity{Caller: "a", Scope: "b", Key: "c"}.ID()
	plain := []byte("personal data: jane@example.com")
	sealed, err := old.Seal(id, plain)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(sealed, plain) || sealed[0] != marker {
		t.Fatal("sealed output leaks the plaintext or lacks the marker")
	}
	rotated, err := NewAESGCM(map[string][]byte{"k1": k1, "k2": k2}, "k2")
	if err != nil {
		t.Fatal(err)
	}
	if got, err := rotated.Open(id, sealed); err != nil || !bytes.Equal(got, plain) {
		t.Fatalf("ok, a rotated ring opens records sealed with the old key: %v", err)
	}
	newer, _ := rotated.Seal(id, plain)
	if _, err := old.Open(id, newer); err == nil {
		t.Fatal("nok, a ring without k2 must not open a k2 record")
	}
	if _, err := rotated.Open(store.Identity{Caller: "x", Scope: "b", Key: "c"}.ID(), sealed); err == nil {
		t.Fatal("nok, a sealed response moved to another record must not open")
	}
	tampered := append([]byte(nil), sealed...)
	tampered[len(tampered)-1] ^= 1
	if _, err := rotated.Open(id, tampered); err == nil {
		t.Fatal("nok, a tampered record must not open")
	}
	for _, bad := range []map[string][]byte{{"k": make([]byte, 16)}, {"": k1}} {
		for kid := range bad {
			if _, err := NewAESGCM(bad, kid); err == nil {
				t.Fatalf("nok, NewAESGCM(%v) must fail", bad)
			}
		}
	}
	if _, err := NewAESGCM(map[string][]byte{"k1": k1}, "k9"); err == nil {
		t.Fatal("nok, a current key outside the ring must fail")
	}
}
