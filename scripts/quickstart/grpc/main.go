// Command grpc is the README's gRPC quick start (README.md, "Quick
// starts"; grpcidem/README.md): a unary server interceptor, here in front
// of the standard health service.
package main

import (
	"context"
	"log"
	"net"
	"net/http"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/memstore"
	"github.com/idemkit/idem/grpcidem"
)

func accountFrom(ctx context.Context) string {
	md, _ := metadata.FromIncomingContext(ctx)
	if v := md.Get("authorization"); len(v) > 0 {
		return v[0]
	}
	return ""
}

func main() {
	caller := func(ctx context.Context) (string, error) {
		return accountFrom(ctx), nil // put there by your auth interceptor
	}
	store := memstore.New() // sqlstore / gormstore / pgxstore: atomic mode; memstore: leased
	e, err := core.New(store,
		core.WithCaller(func(r *http.Request) (string, error) { return caller(r.Context()) })) // HTTP routes, if any
	if err != nil {
		log.Fatal(err)
	}
	idem, err := grpcidem.UnaryServerInterceptor(e,
		grpcidem.WithCaller(caller), // or grpcidem.WithSingleCaller(); one is required
		grpcidem.WithSkipper(func(_ context.Context, m string) bool { return strings.HasSuffix(m, "/Check") }),
		grpcidem.WithMethod("/shop.Orders/Refund", core.Retention(time.Hour)),
		grpcidem.WithRecordedMetadata("location")) // header/trailer keys replayed
	if err != nil {
		log.Fatal(err)
	}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(idem))
	healthpb.RegisterHealthServer(srv, health.NewServer())

	lis, err := net.Listen("tcp", "127.0.0.1:50051")
	if err != nil {
		log.Fatal(err)
	}
	log.Fatal(srv.Serve(lis))
}
