// Package redisstore is an idem store on Redis (github.com/redis/go-redis/v9:
// one server, a Sentinel failover client, or Redis Cluster) for leased
// mode: HTTP routes and gRPC methods whose effects live outside a
// database transaction, and consumers (core.Engine.Once).
//
// Each record is one Redis hash under its own key, prefix + "{" + hex ID +
// "}", and Claim, Extend, Complete and Release are each one Lua script on
// that key: atomic on the server, fenced by the record's token (a takeover
// writes a new token, and every write of the old owner compares it and
// fails with core.ErrFenced), and in one hash slot, so they run unchanged
// on Redis Cluster. Retention is the key's own expiry (Redis deletes a
// record a minute after its ExpiresAt): no Sweeper is needed.
//
// Leases and expiry are decided, as in every idem store, by the times the
// engine passes in; pass the store to syncclock.New and the synced clock
// to core.WithClock so that every process reads the Redis server's clock
// (Store.Now is TIME). The key's expiry is counted by the server's own
// clock, from the durations the engine gives.
//
// Redis replicates asynchronously: a failover can lose a claim or a
// completion the primary acknowledged. WithReplicas makes every write
// wait for replicas (WAIT); the README says what each setting survives.
//
// The store has no transactions (it is not a store.TxStore): an engine over
// it runs every route in leased mode, and a route that asks for atomic
// mode (core.Atomic) fails when it is built.
package redisstore
