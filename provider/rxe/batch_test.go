package rxe

import (
	"bytes"
	"fmt"
	"net/netip"
	"syscall"
	"testing"

	"github.com/softrdma/softrdma/provider/softverbs"
	"github.com/softrdma/softrdma/verbs"
	"github.com/softrdma/softrdma/wire"
)

// TestSendBatch sends a batch mixing good datagrams (with and without
// immediate data, with every pad length, more than one sendmmsg's worth),
// an oversized one, one without GRH and an IPv6 one (which lo cannot
// carry): the good ones arrive in order with valid ICRCs (the receive path
// checks them), the others get Send's outcome.
func TestSendBatch(t *testing.T) {
	d := loDev(t)
	g := randGroup()
	rx := newFakeRx()
	q := newQP(t, d, rx, 0, 5)
	if err := q.AttachMcast(mgid(g), 0); err != nil {
		t.Fatal(err)
	}
	bs := q.drv.(softverbs.BatchSender)
	ah := mcastAH(g)
	v6 := mcastAH(netip.MustParseAddr("ff0e::1:2"))
	noGRH := &verbs.AHAttr{PortNum: 1}
	var batch []softverbs.UDSend
	var want []string
	bad := map[int]syscall.Errno{}
	for i := range 2*softverbs.MaxSendBatch + 3 {
		switch i {
		case 5:
			batch = append(batch, softverbs.UDSend{AH: ah, RemoteQPN: verbs.MulticastQPN, RemoteQKey: 5, Payload: make([]byte, 8192)})
			continue
		case 9:
			batch = append(batch, softverbs.UDSend{AH: noGRH, RemoteQPN: verbs.MulticastQPN, RemoteQKey: 5, Payload: []byte("x")})
			bad[len(batch)-1] = syscall.EINVAL
			continue
		case 40:
			batch = append(batch, softverbs.UDSend{AH: v6, RemoteQPN: verbs.MulticastQPN, RemoteQKey: 5, Payload: []byte("v6")})
			bad[len(batch)-1] = 0 // some error: no IPv6 GID, or no route on lo
			continue
		}
		p := fmt.Sprintf("datagram %d%s", i, bytes.Repeat([]byte{'.'}, i%4))
		batch = append(batch, softverbs.UDSend{AH: ah, RemoteQPN: verbs.MulticastQPN, RemoteQKey: 5, Payload: []byte(p), HasImm: i%2 == 0, Imm: uint32(i)})
		want = append(want, p)
	}
	errs := make([]error, len(batch))
	bs.SendBatch(batch, errs)
	for i, err := range errs {
		e, isBad := bad[i]
		switch {
		case !isBad && err != nil:
			t.Errorf("datagram %d: %v", i, err)
		case isBad && err == nil:
			t.Errorf("datagram %d: no error", i)
		case isBad && e != 0 && !isErrno(err, e):
			t.Errorf("datagram %d: %v, want %v", i, err, e)
		}
	}
	for i, w := range want {
		got := rx.wait(t)
		if string(got.payload) != w {
			t.Fatalf("delivery %d: %q, want %q", i, got.payload, w)
		}
		if got.srcQP != q.QPN() {
			t.Errorf("delivery %d: src QP %#x", i, got.srcQP)
		}
	}
	// The transport reports what it put on the wire: nothing for the
	// oversized datagram (the core counts it as a drop), the whole RoCEv2
	// datagram for the others.
	sent := 0
	for i := range batch {
		switch {
		case i == 5 && (batch[i].Wire != 0 || errs[i] != nil):
			t.Errorf("oversized datagram: wire %d, error %v", batch[i].Wire, errs[i])
		case errs[i] == nil && i != 5 && batch[i].Wire != wire.UDLen(len(batch[i].Payload), batch[i].HasImm):
			t.Errorf("datagram %d: wire %d, want %d", i, batch[i].Wire, wire.UDLen(len(batch[i].Payload), batch[i].HasImm))
		case errs[i] == nil && i != 5:
			sent++
		}
	}
	if sent != len(want) {
		t.Errorf("%d datagrams on the wire, want %d", sent, len(want))
	}
	if c := d.Counters(); c.Get(softverbs.ICRCErrors) != 0 {
		t.Errorf("ICRC errors %d", c.Get(softverbs.ICRCErrors))
	}
}

// TestSendBatchFrames checks that a batched datagram is byte for byte the
// one Send builds in one piece: headers, payload, pad and ICRC.
func TestSendBatchFrames(t *testing.T) {
	d := loDev(t)
	g := randGroup()
	q := newQP(t, d, newFakeRx(), 0, 5)
	if err := d.IncGroup(g); err != nil {
		t.Fatal(err)
	}
	defer d.DecGroup(g)
	for _, size := range []int{0, 1, 2, 3, 4, 64, 1021, 4096} {
		payload := bytes.Repeat([]byte{byte(size)}, size)
		sc := scratchPool.Get().(*sendScratch)
		qq := q.drv.(*qp)
		qq.smu.Lock()
		psn := uint32(size) * 0x10101
		_, ok, err := qq.build(&sc.slots[0], &softverbs.UDSend{AH: mcastAH(g), RemoteQPN: verbs.MulticastQPN, RemoteQKey: 5, PSN: psn, Payload: payload, HasImm: true, Imm: 7})
		qq.smu.Unlock()
		if err != nil || !ok {
			t.Fatalf("build: %v %v", ok, err)
		}
		sl := &sc.slots[0]
		got := append(append(append([]byte(nil), sl.hdr[:sl.hlen]...), payload...), sl.tail[:sl.tlen]...)
		h := wire.UDHeader{PKey: wire.DefaultPKey, DestQP: wire.MulticastQPN, PSN: psn, QKey: 5, SrcQP: qq.qpn, HasImm: true, Imm: 7}
		want := make([]byte, wire.UDLen(size, true))
		n := wire.EncodeUD(want, &h, payload)
		wire.PutICRC(want[n:], wire.ICRCv4(wire.IPv4(sl.ip[:wire.IPv4HeaderLen]), wire.UDP(sl.udp[:]), want[:n]))
		if !bytes.Equal(got, want) || sl.total != len(want) {
			t.Errorf("size %d:\n got %x\nwant %x", size, got, want)
		}
		scratchPool.Put(sc)
	}
}

// TestSpareSocket checks that the receive socket of the last group left
// lingers for a join right after, then closes.
func TestSpareSocket(t *testing.T) {
	d := loDev(t)
	g1, g2 := randGroup(), randGroup()
	if err := d.IncGroup(g1); err != nil {
		t.Fatal(err)
	}
	d.mu.Lock()
	s := d.mships[g1].sock
	d.mu.Unlock()
	if err := d.DecGroup(g1); err != nil {
		t.Fatal(err)
	}
	if err := d.IncGroup(g2); err != nil {
		t.Fatal(err)
	}
	d.mu.Lock()
	reused := d.mships[g2].sock == s && s.idle == nil
	d.mu.Unlock()
	if !reused {
		t.Errorf("a new socket for a join right after the last leave")
	}
	if !igmpState(t, "lo", g1, false) {
		t.Errorf("lo still in %v", g1)
	}
	if err := d.DecGroup(g2); err != nil {
		t.Fatal(err)
	}
	eventually(t, "spare socket closed", func() bool {
		d.mu.Lock()
		defer d.mu.Unlock()
		return len(d.rsocks) == 0
	})
	eventually(t, "receive goroutine gone", func() bool { return receiveGoroutines() == 0 })
}
