// Package grpcidem is idem for gRPC servers.
package grpcidem
