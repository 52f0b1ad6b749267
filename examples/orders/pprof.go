package main

import (
	"log/slog"
	"net/http"
	"net/http/pprof"
)

// servePprof serves the runtime profiles on addr (the hidden -pprof-addr
// flag), on a mux of its own so the API's router never exposes them:
//
//	go tool pprof 'http://ADDR/debug/pprof/profile?seconds=15'
func servePprof(addr string, logger *slog.Logger) {
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	go func() {
		if err := http.ListenAndServe(addr, mux); err != nil {
			logger.Error("orders: pprof: " + err.Error())
		}
	}()
}
