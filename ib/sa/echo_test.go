package sa

import (
	"bytes"
	"testing"

	"github.com/softrdma/softrdma/ib/mad"
)

// TestRecordEcho: the records of a group that a query answers carry the
// creating request's reserved bits of ProxyJoin's byte, its reserved
// bytes and its padding, as OpenSM answers its copy of that request
// (test/saoracle found it); ProxyJoin itself (bit 7) is
// the member's.
func TestRecordEcho(t *testing.T) {
	s := newSA(Config{SendOnlySupport: true})
	mgid := gid("ff12:abcd::77")
	create := req(mad.MethodSet, mad.CompCreateRequired, udpJoin(mgid, guidB, mad.JoinFullMember))
	tail := []byte{0x81, 0x5a, 0xa5, 1, 2, 3, 4} // ProxyJoin, reserved bit 0, reserved bytes, padding
	copy(create.SAData()[mad.MCMemberRecordEchoOffset:], tail)
	rs := s.Handle(create, From{GUID: guidA}) // a proxy join: A for B
	if len(rs) != 1 || rs[0].Status() != 0 {
		t.Fatalf("create: %v", rs)
	}
	if got := rs[0].SAData()[mad.MCMemberRecordEchoOffset:mad.MCMemberRecordStride]; !bytes.Equal(got, tail) {
		t.Fatalf("Set answer echoes % x, want % x", got, tail)
	}
	// A second group, created without reserved bits, keeps zeros.
	plain := gid("ff12:abcd::78")
	if rs := s.Handle(req(mad.MethodSet, mad.CompCreateRequired, udpJoin(plain, guidC, mad.JoinFullMember)), From{GUID: guidC}); rs[0].Status() != 0 {
		t.Fatalf("create plain: %#x", rs[0].Status())
	}

	check := func(name string, rec []byte, want []byte) {
		t.Helper()
		if got := rec[mad.MCMemberRecordEchoOffset:mad.MCMemberRecordStride]; !bytes.Equal(got, want) {
			t.Errorf("%s: % x, want % x", name, got, want)
		}
	}
	echoed := []byte{0x01, 0x5a, 0xa5, 1, 2, 3, 4}
	trusted := req(mad.MethodGet, mad.CompMGID|mad.CompPortGID, udpJoin(mgid, guidB, 0))
	trusted.SetSMKey(DefaultSMKey)
	rs = s.Handle(trusted, From{GUID: guidA})
	if len(rs) != 1 || rs[0].Status() != 0 || !rs[0].MCMemberRecord().ProxyJoin() {
		t.Fatalf("trusted Get: %v", rs)
	}
	check("trusted Get (proxy member)", rs[0].SAData(), append([]byte{0x81}, echoed[1:]...))
	rs = s.Handle(req(mad.MethodGet, mad.CompMGID, udpJoin(mgid, guidA, 0)), From{GUID: guidA})
	check("untrusted Get", rs[0].SAData(), echoed)

	table := req(mad.MethodGetTable, 0, mad.MCMemberFields{})
	rs = s.Handle(table, From{GUID: guidA})
	var re mad.Reassembler
	var data []byte
	for _, m := range rs {
		done, d, err := re.Add(m)
		if err != nil {
			t.Fatal(err)
		}
		if done {
			data = d
		}
	}
	seen := 0
	for i := 0; i+mad.MCMemberRecordStride <= len(data); i += mad.MCMemberRecordStride {
		r := data[i : i+mad.MCMemberRecordStride]
		switch mad.MCMemberRecord(r).MGID() {
		case mgid:
			check("GetTable record", r, echoed)
			seen++
		case plain, BroadcastMGID:
			check("GetTable record", r, make([]byte, len(echoed)))
			seen++
		}
	}
	if seen != 3 {
		t.Fatalf("GetTable: %d of 3 groups in % x", seen, data)
	}
}
