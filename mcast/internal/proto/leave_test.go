package proto

import (
	"testing"
	"time"
)

// queueEnv keeps what a member sends, in order, for the test to deliver.
type queueEnv struct{ out [][]byte }

func (e *queueEnv) Multicast(pkt []byte)         { e.out = append(e.out, append([]byte(nil), pkt...)) }
func (e *queueEnv) Unicast(_ uint32, pkt []byte) { e.out = append(e.out, append([]byte(nil), pkt...)) }

// take returns what was sent since the last take.
func (e *queueEnv) take() [][]byte {
	out := e.out
	e.out = nil
	return out
}

// deliver hands pkts to m in order.
func deliver(now int64, m *Member, pkts [][]byte) {
	for _, p := range pkts {
		m.Handle(now, p)
	}
}

// leavePair is a sender (session 1) with one receiver (session 2) that
// joined its stream and read its one message; every packet sent so far
// was delivered.
func leavePair(t *testing.T) (snd, rcv *Member, se, re *queueEnv, now int64) {
	t.Helper()
	cfg := Config{MTU: 256, Window: 16}
	se, re = &queueEnv{}, &queueEnv{}
	cfg.Session = 1
	snd = New(cfg, se)
	cfg.Session = 2
	rcv = New(cfg, re)
	ms := int64(time.Millisecond)
	snd.Announce(now)
	snd.Tick(now) // the first heartbeat
	deliver(now, rcv, se.take())
	deliver(now, snd, re.take()) // the Hello
	deliver(now, rcv, se.take()) // the Welcome
	if snd.Receivers() != 1 {
		t.Fatalf("sender has %d receivers, want 1", snd.Receivers())
	}
	now += ms
	msg := make([]byte, 64)
	if got := snd.Write(now, msg, 0); got != RecordLen(len(msg)) {
		t.Fatalf("Write took %d of %d", got, RecordLen(len(msg)))
	}
	snd.Flush(now)
	deliver(now, rcv, se.take())
	buf := make([]byte, 128)
	if n, from, ok, err := rcv.Read(now, buf); !ok || err != nil || n != len(msg) || from != 1 {
		t.Fatalf("Read: %d from %d, %v, %v", n, from, ok, err)
	}
	deliver(now, snd, re.take())
	return snd, rcv, se, re, now
}

// TestLeaveThenHeartbeat is the order mcast's Close met (a sender's Close
// then waited its whole Linger for a receiver that had closed): the
// receiver leaves, then its Conn's loop, still running, takes the
// sender's heartbeat asking for acks. A member that left must send
// nothing more: a Status after its Leave made the sender count it as a
// receiver again, one that would never ack the stream's end.
func TestLeaveThenHeartbeat(t *testing.T) {
	snd, rcv, se, re, now := leavePair(t)
	rcv.Leave()
	if got := re.take(); len(got) != 1 || Packet(got[0]).Type() != TypeLeave {
		t.Fatalf("Leave sent %d packets, want one Leave", len(got))
	} else {
		deliver(now, snd, got)
	}
	if snd.Receivers() != 0 {
		t.Fatalf("after the Leave the sender has %d receivers, want 0", snd.Receivers())
	}
	// The sender's heartbeat (it holds a packet not acked by all it
	// knew: AckReq) reaches the receiver after its Leave.
	now += int64(time.Millisecond)
	snd.Tick(now)
	deliver(now, rcv, se.take())
	rcv.Tick(now + int64(time.Second))
	if got := re.take(); len(got) != 0 {
		t.Errorf("the member sent %d packets after its Leave (first: type %d)", len(got), Packet(got[0]).Type())
		deliver(now, snd, got)
	}
	snd.Finish(now)
	if !snd.Drained() {
		t.Errorf("the sender is not drained: %d receivers, for one that left", snd.Receivers())
	}
}

// TestStatusAfterLeave: a receiver's Status overtaken by its Leave (the
// network reorders) does not make the sender count it again.
func TestStatusAfterLeave(t *testing.T) {
	snd, rcv, se, re, now := leavePair(t)
	now += int64(time.Millisecond)
	snd.Tick(now) // a heartbeat asking for acks
	deliver(now, rcv, se.take())
	status := re.take()
	if len(status) != 1 || Packet(status[0]).Type() != TypeStatus {
		t.Fatalf("the receiver answered the heartbeat with %d packets, want one Status", len(status))
	}
	rcv.Leave()
	deliver(now, snd, re.take())
	deliver(now, snd, status)
	if snd.Receivers() != 0 {
		t.Errorf("the sender has %d receivers after a Leave and a Status from before it, want 0", snd.Receivers())
	}
	snd.Finish(now)
	if !snd.Drained() {
		t.Error("the sender is not drained")
	}
	// A Leave that overtook the receiver's first Status (its Hello) too.
	now += int64(time.Millisecond)
	var b [StatusLen]byte
	n := PutLeave(b[:], 1, 3)
	snd.Handle(now, b[:n])
	n = PutStatus(b[:], 1, 3, 0, 16, FlagHello)
	snd.Handle(now, b[:n])
	if snd.Receivers() != 0 || !snd.Drained() {
		t.Errorf("a Hello after its member's Leave made a receiver (%d receivers)", snd.Receivers())
	}
	// Long after, the session is forgotten.
	for range 5 {
		now += int64(time.Second)
		snd.Tick(now)
	}
	if len(snd.out.left) != 0 {
		t.Errorf("the sender still remembers %d left receivers after 5 s", len(snd.out.left))
	}
}
