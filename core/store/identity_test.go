package store

import "testing"

func TestIdentityID(t *testing.T) {
	ids := map[ID]Identity{}
	for _, i := range []Identity{
		{"a:b", "c", "k"}, {"a", "b:c", "k"}, {"a", "b", "c:k"}, {"", "ab", "k"}, {"ab", "", "k"},
		{"a", "b", "k"}, {"b", "a", "k"}, {"acct_1", "POST /orders", "k"}, {"acct_2", "POST /orders", "k"},
	} {
		id := i.ID()
		if prev, dup := ids[id]; dup {
			t.Fatalf("%+v and %+v share ID %s", prev, i, id)
		}
		ids[id] = i
		if id != i.ID() {
			t.Fatal("ID is not deterministic")
		}
	}
	if s := (Identity{"a", "b", "c"}).ID().String(); len(s) != 64 {
		t.Fatalf("ID.String() = %q, want 64 hex digits", s)
	}
}
