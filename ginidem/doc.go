// Package ginidem adds Idempotency-Key support to Gin routers.
package ginidem
