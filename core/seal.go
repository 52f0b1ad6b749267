package core

// Sealer seals recorded responses at rest, because they may hold personal
// data (package seal has one: seal.NewAESGCM). Seal's output must start with the byte 0x02; the record ID is bound
// as additional data so a sealed response cannot be moved to another record.
// Seal must not keep plain (or a slice of it) beyond the call.
type Sealer interface {
	Seal(id ID, plain []byte) ([]byte, error)
	Open(id ID, sealed []byte) ([]byte, error)
}
