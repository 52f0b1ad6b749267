// Package chiidem adds Idempotency-Key support to chi routers.
package chiidem
