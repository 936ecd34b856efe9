package sm

import (
	"net"
	"testing"
	"time"

	"github.com/softrdma/softrdma/ib/mad"
	"github.com/softrdma/softrdma/ib/sa"
)

// rmppPeer is a raw SA client that acknowledges by hand.
type rmppPeer struct {
	t    *testing.T
	conn *net.UDPConn
}

func newRMPPPeer(t *testing.T, s *SM) *rmppPeer {
	conn, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(s.SAAddr()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return &rmppPeer{t: t, conn: conn}
}

func (p *rmppPeer) write(m mad.MAD) {
	p.t.Helper()
	if _, err := p.conn.Write(m); err != nil {
		p.t.Fatal(err)
	}
}

// next returns the next datagram from the SA.
func (p *rmppPeer) next() mad.MAD {
	p.t.Helper()
	buf := make([]byte, 1024)
	p.conn.SetReadDeadline(time.Now().Add(waitTimeout))
	n, err := p.conn.Read(buf)
	if err != nil {
		p.t.Fatalf("no datagram from the SA: %v", err)
	}
	return mad.MAD(buf[:n])
}

// segment reads datagrams until RMPP DATA segment num of transfer tid,
// skipping resent copies of lower segments still in flight; any other
// datagram (a segment above num: the window overrun) fails the test.
func (p *rmppPeer) segment(tid uint64, num uint32) mad.MAD {
	p.t.Helper()
	for {
		m := p.next()
		if m.TID() != tid || m.RMPPType() != mad.RMPPTypeData || m.SegmentNumber() > num {
			p.t.Fatalf("got tid %#x RMPP type %d segment %d, want DATA segment %d of tid %#x",
				m.TID(), m.RMPPType(), m.SegmentNumber(), num, tid)
		}
		if m.SegmentNumber() == num {
			return m
		}
	}
}

// active returns the number of RMPP transfers in progress.
func (s *SM) active() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.rmpp)
}

// rmppSM runs an SM holding 5 groups of 2 members: a trusted GetTable of
// them is 10 records, 3 RMPP segments.
func rmppSM(t *testing.T, cfg Config) *SM {
	cfg.Ports = []uint64{0x100001, 0x100003}
	s := startSM(t, cfg)
	for i := range 5 {
		g := mgid("ff12:4001:ffff::601:200")
		g[15] = byte(i)
		mustStatus(t, rawSA(t, s.SAAddr(), mcReq(mad.MethodSet, mad.CompCreateRequired, g, 0x100001, 1), waitTimeout), 0)
		mustStatus(t, rawSA(t, s.SAAddr(), mcReq(mad.MethodSet, mad.CompCreateRequired, g, 0x100003, 2), waitTimeout), 0)
	}
	return s
}

func getTable(tid uint64) mad.MAD {
	q := mad.NewSARequest(mad.MethodGetTable, mad.AttrMCMemberRecord, tid, 0)
	q.SetSMKey(sa.DefaultSMKey)
	return q
}

// waitStats waits until cond holds for the SM's counters.
func waitStats(t *testing.T, s *SM, what string, cond func(Stats) bool) Stats {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for {
		st := s.Stats()
		if cond(st) {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: stats %+v", what, st)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestRMPPSenderHoldsBack: the SA's RMPP sender sends segment 1 alone
// (window 1), sends nothing above the receiver's NewWindowLast, resends
// the unacknowledged segments when an ACK is late or lost, and is done
// when the last segment is acknowledged.
func TestRMPPSenderHoldsBack(t *testing.T) {
	s := rmppSM(t, Config{RMPPTimeout: 50 * time.Millisecond, RMPPRetries: 1000})
	p := newRMPPPeer(t, s)
	p.write(getTable(0x77))
	s1 := p.segment(0x77, 1)
	// No ACK: the next datagram is segment 1 again, not segment 2.
	p.segment(0x77, 1)
	// ACK segment 1 with a window of 2: segment 2 only, then (no ACK)
	// segment 2 again, never segment 3.
	p.write(mad.NewRMPPAck(s1, 1, 2))
	s2 := p.segment(0x77, 2)
	p.segment(0x77, 2)
	// A window reaching the last segment: segment 3 comes; its ACK is
	// "lost", so segment 3 comes again.
	p.write(mad.NewRMPPAck(s2, 2, 3))
	s3 := p.segment(0x77, 3)
	if s3.RMPPFlags()&mad.RMPPFlagLast == 0 {
		t.Fatal("segment 3 is not the last")
	}
	p.segment(0x77, 3)
	// An old ACK changes nothing: segment 3 again after the timeout.
	p.write(mad.NewRMPPAck(s1, 1, 2))
	p.segment(0x77, 3)
	// The final ACK ends the transfer.
	p.write(mad.NewRMPPAck(s3, 3, 3))
	deadline := time.Now().Add(waitTimeout)
	for s.active() != 0 {
		if time.Now().After(deadline) {
			t.Fatal("transfer still active after the final ACK")
		}
		time.Sleep(time.Millisecond)
	}
	st := s.Stats()
	if st.RMPPTransfers < 1 || st.RMPPRetransmits < 4 || st.RMPPTimeouts != 0 || st.RMPPAborts != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// TestRMPPSenderGivesUp: without ACKs the transfer is resent RMPPRetries
// times and then dropped.
func TestRMPPSenderGivesUp(t *testing.T) {
	s := rmppSM(t, Config{RMPPTimeout: 20 * time.Millisecond, RMPPRetries: 2})
	p := newRMPPPeer(t, s)
	p.write(getTable(0x79))
	var s1 mad.MAD
	for range 3 {
		s1 = p.segment(0x79, 1)
	}
	st := waitStats(t, s, "transfer dropped", func(st Stats) bool { return st.RMPPTimeouts == 1 })
	if st.RMPPRetransmits != 2 || s.active() != 0 {
		t.Fatalf("%d segments resent, want 2; %d transfers active", st.RMPPRetransmits, s.active())
	}
	// An ACK for the dropped transfer is ignored; the SA still answers.
	p.write(mad.NewRMPPAck(s1, 1, 3))
	p.write(getTable(0x7A))
	p.segment(0x7A, 1)
}

// TestRMPPSenderAborts: a bad ACK (NewWindowLast below its segment) is
// answered with an RMPP ABORT (W2S) and ends the transfer; so does an
// ABORT from the receiver, without an answer.
func TestRMPPSenderAborts(t *testing.T) {
	s := rmppSM(t, Config{RMPPTimeout: time.Minute})
	p := newRMPPPeer(t, s)
	p.write(getTable(0x7B))
	s1 := p.segment(0x7B, 1)
	p.write(mad.NewRMPPAck(s1, 1, 0))
	a := p.next()
	if a.RMPPType() != mad.RMPPTypeAbort || a.RMPPStatus() != mad.RMPPStatusW2S || a.TID() != 0x7B || a.Method() != mad.MethodGetTableResp { // nack_recv flips the ACK's method
		t.Fatalf("answer to a bad ACK: type %d status %d method %#x", a.RMPPType(), a.RMPPStatus(), a.Method())
	}
	waitStats(t, s, "aborted", func(st Stats) bool { return st.RMPPAborts == 1 })

	p.write(getTable(0x7C))
	s1 = p.segment(0x7C, 1)
	p.write(mad.NewRMPPAbort(s1, mad.RMPPStatusT2L))
	waitStats(t, s, "aborted by the receiver", func(st Stats) bool { return st.RMPPAborts == 2 })
	// Nothing more of that transfer: the next datagram answers a new request.
	p.write(mad.NewSARequest(mad.MethodGet, mad.AttrClassPortInfo, 0x7D, 0))
	if m := p.next(); m.TID() != 0x7D {
		t.Fatalf("datagram of tid %#x after the abort", m.TID())
	}
}
