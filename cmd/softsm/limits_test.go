package main

import (
	"net"
	"strings"
	"testing"

	"github.com/softrdma/softrdma/ib/fabric"
	"github.com/softrdma/softrdma/ib/mad"
	"github.com/softrdma/softrdma/wire"
)

// TestQuotaFlags: -max-groups-per-port caps the
// groups a port creates (one more is answered 0x0100, logged with -v)
// while another port still creates one; -max-ports-per-source caps the
// ports of one source address (one more is refused, source_limit).
func TestQuotaFlags(t *testing.T) {
	t.Parallel()
	p := start(t, "-port", "0x100001,0x100003", "-max-groups-per-port", "2", "-max-ports-per-source", "1", "-v")
	join := func(i int, port string) uint16 {
		j := mad.NewSARequest(mad.MethodSet, mad.AttrMCMemberRecord, uint64(0x100+i), mad.CompCreateRequired)
		f := mad.MCMemberFields{MGID: wire.GID{0xff, 0x12, 0x40, 0x01, 0xff, 0xff, 15: byte(i)}, PortGID: mustGID(port),
			QKey: 0x01234567, PKey: 0xFFFF, JoinState: mad.JoinFullMember}
		j.MCMemberRecord().Encode(&f)
		return query(t, p.sa, j).Status()
	}
	for i := range 2 {
		if st := join(i, "fe80::10:1"); st != 0 {
			t.Fatalf("create %d: status %#04x", i, st)
		}
	}
	if st := join(2, "fe80::10:1"); st != mad.StatusNoResources {
		t.Fatalf("create over the quota: status %#04x, want 0x0100", st)
	}
	if st := join(2, "fe80::10:3"); st != 0 {
		t.Fatalf("another port's create: status %#04x", st)
	}
	attach := func(guid uint64) *fabric.Control {
		c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		m, err := attachFrom(c, p.fabric, guid)
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	if m := attach(0x200001); m.Type != fabric.TypePortInfo {
		t.Fatalf("first attach: %+v", m)
	}
	if m := attach(0x200002); m.Type != fabric.TypeRefused || m.Reason != fabric.ReasonSourceLimit {
		t.Fatalf("second attach from 127.0.0.1: %+v, want refused source_limit", m)
	}
	p.stop(t)
	for _, s := range []string{"limits: 1 ports per source address, 2 groups created", "group quota (2)", "the most one source address may attach"} {
		if !strings.Contains(p.stderr.String(), s) {
			t.Errorf("-v log lacks %q: %s", s, p.stderr.String())
		}
	}
}
