package memstore_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/memstore"
	"github.com/idemkit/idem/core/store"
)

// A claim made in a transaction that rolls back leaves the identity absent,
// as it would in a database.
func ExampleStore_Atomic() {
	ctx := context.Background()
	st := memstore.New().Atomic()
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	id := store.Identity{Caller: "acct_1", Scope: "POST /orders", Key: "8e03978e"}.ID()
	claim := store.ClaimRequest{ID: id, Token: 1, Now: now, ExpiresAt: now.Add(24 * time.Hour)}

	tctx, tx, err := st.Begin(ctx)
	if err != nil {
		panic(err)
	}
	res, _ := st.Claim(tctx, claim)
	fmt.Println("claimed in the transaction:", res.Claimed)

	claim.Token = 2
	res, _ = st.Claim(ctx, claim)
	fmt.Println("outside it:", res.Claimed, res.Record.State)

	_ = tx.Rollback()
	_, err = st.Get(ctx, id, now)
	fmt.Println("after rollback, absent:", errors.Is(err, core.ErrNotFound))
	// Output:
	// claimed in the transaction: true
	// outside it: false in_progress
	// after rollback, absent: true
}
