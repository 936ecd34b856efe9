package main

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/softrdma/softrdma/ib/fabric"
	"github.com/softrdma/softrdma/ib/mad"
	"github.com/softrdma/softrdma/wire"
)

// TestSIGTERMMidQuery: 1,500 ports attached from one address, one of them
// asks four times for every path between every two ports
// (SubnAdmGetTable(PathRecord), component mask 0: 2.25 M records each);
// once softsm has read the first it gets SIGTERM, and exits 0 within a
// second (it used to build the tables first, under the lock Close needs:
// more than 30 s with -race, and gigabytes).
func TestSIGTERMMidQuery(t *testing.T) {
	const ports = 1500
	p := start(t, "-port-timeout", "5m")
	ip := netip.MustParseAddr("127.0.4.1")
	var attacker *net.UDPConn
	var lid uint16
	for i := range ports {
		c, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(ip, 0)))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		m, err := attachFrom(c, p.fabric, 0x7500_0000+uint64(i))
		if err != nil || m.Type != fabric.TypePortInfo {
			t.Fatalf("attach %d: %+v %v", i, m, err)
		}
		if i == 0 {
			attacker, lid = c, m.LID
		}
	}
	send := func(tid uint64) {
		q := mad.NewSARequest(mad.MethodGetTable, mad.AttrPathRecord, tid, 0)
		h := &fabric.UDPacket{DLID: fabric.SMLID, SLID: lid,
			UD: wire.UDHeader{PKey: 0xFFFF, DestQP: fabric.SAQPN, QKey: fabric.SAQKey, SrcQP: fabric.SAQPN}}
		b := make([]byte, fabric.PacketLen(len(q), false, false))
		fabric.EncodeUD(b, h, q)
		if _, err := attacker.WriteToUDPAddrPort(b, p.fabric); err != nil {
			t.Fatal(err)
		}
	}
	// The first query: softsm has read it once its fabric socket holds
	// nothing; then three more.
	send(0x7AB1E)
	for deadline := time.Now().Add(10 * time.Second); rxQueue(t, p.fabric.Port()) != 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("softsm did not read the query")
		}
	}
	for i := range 3 {
		send(0x7AB1F + uint64(i))
	}
	t0 := time.Now()
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		took := time.Since(t0)
		t.Logf("exited %v after SIGTERM", took.Round(time.Millisecond))
		if p.err != nil {
			t.Fatalf("softsm exit: %v; stderr: %s", p.err, p.stderr.String())
		}
		limit := time.Second
		if raceEnabled {
			limit += time.Second // a -race binary sleeps 1 s at exit (GORACE atexit_sleep_ms)
		}
		if took > limit {
			t.Errorf("softsm took %v to exit after SIGTERM", took)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("softsm did not exit within 30 s of SIGTERM")
	}
}

// rxQueue is the bytes waiting in the receive queue of the UDP socket
// bound to port (/proc/net/udp).
func rxQueue(t *testing.T, port uint16) int {
	t.Helper()
	b, err := os.ReadFile("/proc/net/udp")
	if err != nil {
		t.Skip(err)
	}
	suffix := fmt.Sprintf(":%04X", port)
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) > 4 && strings.HasSuffix(f[1], suffix) {
			var tx, rx int
			fmt.Sscanf(f[4], "%x:%x", &tx, &rx)
			return rx
		}
	}
	t.Fatalf("no socket of port %d in /proc/net/udp", port)
	return 0
}

// TestStopping: after the signal, a second one ends softsm at once (the
// default action is back), and a stop that takes longer than stopGrace
// exits 1.
func TestStopping(t *testing.T) {
	var errb strings.Builder
	ran := make(chan struct{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	grace := stopGrace
	stopGrace = 50 * time.Millisecond
	t.Cleanup(func() { stopGrace = grace })
	stopped := make(chan struct{})
	exited := make(chan int, 1)
	old := exit
	exit = func(code int) { exited <- code }
	t.Cleanup(func() { exit = old })
	done := make(chan struct{})
	go func() { stopping(ctx, func() { close(stopped) }, ran, &errb); close(done) }()
	cancel()
	<-stopped
	select {
	case code := <-exited:
		if code != 1 || !strings.Contains(errb.String(), "not stopped") {
			t.Errorf("exit %d, stderr %q", code, errb.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no exit after stopGrace")
	}
	close(ran)
	<-done
}
