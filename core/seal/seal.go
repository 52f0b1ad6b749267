// Package seal seals the responses idem records, at rest: Sealer is what
// the engine asks of a sealer (core.WithSealer), and AESGCM is one, with
// AES-256-GCM and a key ring for rotation.
package seal

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"errors"
	"fmt"

	"github.com/idemkit/idem/core/store"
	"github.com/idemkit/idem/internal/errconfig"
)

// Sealer seals recorded responses at rest, because they may hold personal
// data. Seal's output must start with the byte 0x02; the record ID is
// bound as additional data so a sealed response cannot be moved to another
// record. Seal must not keep plain (or a slice of it) beyond the call.
type Sealer interface {
	Seal(id store.ID, plain []byte) ([]byte, error)
	Open(id store.ID, sealed []byte) ([]byte, error)
}

// marker is the first byte of a sealed response (see Sealer).
const marker = 0x02

var errCorrupt = errors.New("idem: corrupt sealed response")

var _ Sealer = (*AESGCM)(nil)

// AESGCM is a Sealer with AES-256-GCM and a key ring for rotation: it seals
// with the current key and opens with any key of the ring, by the key id
// stored in each sealed response.
type AESGCM struct {
	current string
	aeads   map[string]cipher.AEAD
}

// NewAESGCM returns a sealer over keys (key id → 32-byte key) that seals
// with keys[current]. Key ids are 1 to 255 bytes. Rotate by adding a new key
// and making it current; drop an old key once no live record uses it (after
// one retention window).
func NewAESGCM(keys map[string][]byte, current string) (*AESGCM, error) {
	if _, ok := keys[current]; !ok {
		return nil, fmt.Errorf("%w: current key id %q is not in the key ring", errconfig.Err, current)
	}
	s := &AESGCM{current: current, aeads: make(map[string]cipher.AEAD, len(keys))}
	for kid, key := range keys {
		if len(kid) == 0 || len(kid) > 255 {
			return nil, fmt.Errorf("%w: key id %q must be 1 to 255 bytes", errconfig.Err, kid)
		}
		if len(key) != 32 {
			return nil, fmt.Errorf("%w: key %q is %d bytes, AES-256 needs 32", errconfig.Err, kid, len(key))
		}
		block, err := aes.NewCipher(key)
		if err != nil {
			return nil, err
		}
		aead, err := cipher.NewGCM(block)
		if err != nil {
			return nil, err
		}
		s.aeads[kid] = aead
	}
	return s, nil
}

// Seal returns 0x02, len(kid), kid, nonce, ciphertext||tag.
func (s *AESGCM) Seal(id store.ID, plain []byte) ([]byte, error) {
	aead := s.aeads[s.current]
	ns := aead.NonceSize()
	out := make([]byte, 0, 2+len(s.current)+ns+len(plain)+aead.Overhead())
	out = append(out, marker, byte(len(s.current)))
	out = append(out, s.current...)
	nonce := out[len(out) : len(out)+ns]
	if _, err := rand.Read(nonce); err != nil {
		return nil, err
	}
	out = out[:len(out)+ns]
	return aead.Seal(out, nonce, plain, id[:]), nil
}

// Open reverses Seal with the key named in sealed.
func (s *AESGCM) Open(id store.ID, sealed []byte) ([]byte, error) {
	if len(sealed) < 2 || sealed[0] != marker {
		return nil, errors.New("idem: not a sealed response")
	}
	n := int(sealed[1])
	if len(sealed) < 2+n {
		return nil, errCorrupt
	}
	kid := string(sealed[2 : 2+n])
	aead, ok := s.aeads[kid]
	if !ok {
		return nil, fmt.Errorf("idem: sealed with key id %q, which is not in the key ring", kid)
	}
	rest := sealed[2+n:]
	if len(rest) < aead.NonceSize() {
		return nil, errCorrupt
	}
	plain, err := aead.Open(nil, rest[:aead.NonceSize()], rest[aead.NonceSize():], id[:])
	if err != nil {
		return nil, fmt.Errorf("idem: opening the sealed response: %w", err)
	}
	return plain, nil
}
