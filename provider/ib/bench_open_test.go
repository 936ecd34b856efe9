package ib_test

import (
	"context"
	"net/netip"
	"testing"

	"github.com/softrdma/softrdma/ib/sm"
	"github.com/softrdma/softrdma/provider/ib"
)

// BenchmarkOpen measures Open (attach until the port is active) and Close
// of a port on a local SM.
func BenchmarkOpen(b *testing.B) {
	s, err := sm.New(sm.Config{Listen: "127.0.0.1:0"})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	for b.Loop() {
		d, err := ib.Open(ib.Config{SM: s.FabricAddr().String(), Local: netip.MustParseAddr("127.0.2.13")})
		if err != nil {
			b.Fatal(err)
		}
		d.Close()
	}
}
