// Package echoidem adds Idempotency-Key support to Echo (v4) routers.
package echoidem
