package grpcidem_test

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/memstore"
	"github.com/idemkit/idem/grpcidem"
)

type exampleAccount struct{}

// The interceptor goes after your authentication interceptor, which puts
// the account in the context; the caller function reads it from there.
// Reads are left out; a refund may be retried for an hour.
func Example() {
	caller := func(ctx context.Context) (string, error) {
		account, _ := ctx.Value(exampleAccount{}).(string)
		return account, nil
	}
	e, err := core.New(memstore.New(), // sqlstore, gormstore or pgxstore for atomic mode
		core.WithCaller(func(r *http.Request) (string, error) { return caller(r.Context()) })) // the same caller over HTTP
	if err != nil {
		panic(err)
	}
	idem, err := grpcidem.UnaryServerInterceptor(e,
		grpcidem.WithCaller(caller),
		grpcidem.WithSkipper(func(_ context.Context, method string) bool { return method == "/shop.Orders/GetOrder" }),
		grpcidem.WithMethod("/shop.Orders/Refund", core.Retention(time.Hour)),
		grpcidem.WithRecordedMetadata("location"))
	if err != nil {
		panic(err)
	}
	auth := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		md, _ := metadata.FromIncomingContext(ctx)
		if v := md.Get("authorization"); len(v) == 1 {
			ctx = context.WithValue(ctx, exampleAccount{}, v[0]) // a real service checks the token
		}
		return handler(ctx, req)
	}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(auth, idem))
	defer srv.Stop()
	fmt.Println("serving")
	// Output: serving
}
