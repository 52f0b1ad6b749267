package store

import (
	"crypto/sha256"
	"encoding/binary"
)

// Identity names one record: who asks (Caller), which unit of work (Scope)
// and the client's Key. Two identities that differ in any part never share a
// record.
type Identity struct {
	Caller string
	Scope  string
	Key    string
}

// ID returns the fixed-size record ID: SHA-256 over the three parts, each
// length-prefixed, so ("a:b", "c") and ("a", "b:c") never collide.
func (i Identity) ID() ID {
	h := sha256.New()
	var n [8]byte
	for _, s := range [...]string{i.Caller, i.Scope, i.Key} {
		binary.BigEndian.PutUint64(n[:], uint64(len(s)))
		h.Write(n[:])
		h.Write([]byte(s))
	}
	var id ID
	h.Sum(id[:0])
	return id
}

// DownstreamKey returns the idempotency key of step (such as "charge") of
// the record id, for an external API: what core.DownstreamKey returns in
// every attempt of the record, so a resolver (which is given the record)
// asks the provider about the key the attempts used.
func (id ID) DownstreamKey(step string) string {
	return Identity{Caller: id.String(), Scope: "idem/downstream", Key: step}.ID().String()
}

// EffectGuard returns the ID of the effect guard of the record id: the row
// that core.MarkEffect commits, on a connection of its own, before an
// atomic attempt's external effect, so that the effect stays known when
// the attempt's transaction never commits (a session the database
// killed, a COMMIT lost with the database out of reach). It is the ID of
// an identity no request has (the engine never claims an empty key).
func (id ID) EffectGuard() ID {
	return Identity{Caller: id.String(), Scope: "idem/effect-guard"}.ID()
}
