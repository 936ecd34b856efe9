package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/softrdma/softrdma/ib/mad"
	"github.com/softrdma/softrdma/ib/sm"
	"github.com/softrdma/softrdma/wire"
)

// TestSAQuery joins a pre-registered port to a group through the SA's raw
// MAD port and lists the groups with saquery.
func TestSAQuery(t *testing.T) {
	s, err := sm.New(sm.Config{Listen: "127.0.0.1:0", SAListen: "127.0.0.1:0", SendOnlySupport: true, Ports: []uint64{0x100001, 0x100003}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()

	conn, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(s.SAAddr()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	mgid, _ := wire.ParseGID("ff12:4001:ffff::1234")
	for i, port := range []string{"fe80::10:1", "fe80::10:3"} {
		pg, _ := wire.ParseGID(port)
		req := mad.NewSARequest(mad.MethodSet, mad.AttrMCMemberRecord, uint64(100+i), mad.CompCreateRequired)
		req.MCMemberRecord().Encode(&mad.MCMemberFields{MGID: mgid, PortGID: pg, QKey: 0x01234567, PKey: 0xffff, JoinState: byte(1 << (3 * i))})
		if _, err := conn.Write(req); err != nil {
			t.Fatal(err)
		}
		conn.SetReadDeadline(time.Now().Add(3 * time.Second))
		resp := make([]byte, mad.Len)
		if _, err := conn.Read(resp); err != nil {
			t.Fatal(err)
		}
		if st := mad.MAD(resp).Status(); st != 0 {
			t.Fatalf("join of %s: status %#x", port, st)
		}
	}
	var out, errOut bytes.Buffer
	if code := run([]string{"saquery", "-sa", s.SAAddr().String()}, &out, &errOut); code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	text := out.String()
	for _, want := range []string{
		"MGID....................ff12:401b:ffff::ffff:ffff", "Mlid....................0xC000", "Qkey....................0x00000B1B",
		"MGID....................ff12:4001:ffff::1234", "Mlid....................0xC001",
		"PortGid.................fe80::10:1  JoinState 0x1", "PortGid.................fe80::10:3  JoinState 0x8",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("saquery output lacks %q:\n%s", want, text)
		}
	}
	out.Reset()
	if code := run([]string{"saquery", "-sa", s.SAAddr().String(), "-json"}, &out, &errOut); code != 0 {
		t.Fatalf("json: exit %d", code)
	}
	var groups []saGroup
	if err := json.Unmarshal(out.Bytes(), &groups); err != nil || len(groups) != 2 || len(groups[1].Members) != 2 {
		t.Fatalf("json %v: %s", err, out.String())
	}
	// Nothing listens there: a clear error, not a hang.
	if code := run([]string{"saquery", "-sa", "127.0.0.1:1", "-timeout", "300ms"}, &out, &errOut); code != 1 {
		t.Errorf("unreachable SA: exit %d", code)
	}
}
