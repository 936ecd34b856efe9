package proto

import (
	"testing"
	"time"
)

type nullEnv struct{ sent int }

func (e *nullEnv) Multicast([]byte)       { e.sent++ }
func (e *nullEnv) Unicast(uint32, []byte) { e.sent++ }

// FuzzHandle feeds a member packets from the network as they come:
// whatever the bytes, it neither panics nor delivers a record longer than
// MaxMessage, and its timers go on.
func FuzzHandle(f *testing.F) {
	b := make([]byte, 64)
	n := PutData(b, 7, 0, 0, 0)
	b[n] = 3
	copy(b[n+1:], "abc")
	f.Add(b[:n+4])
	n = PutHeartbeat(b, 7, 5, 0, FlagWelcome|FlagAckReq)
	f.Add(b[:n])
	n = PutStatus(b, 1, 9, 0, 16, FlagHello)
	f.Add(b[:n])
	n = PutNack(b, 1, 9, 1)
	PutNackRange(b, 0, 0, 3)
	f.Add(b[:n])
	n = PutEvict(b, 7, 1, 100)
	f.Add(b[:n])
	n = PutLeave(b, 1, 9)
	f.Add(b[:n])
	f.Fuzz(func(t *testing.T, data []byte) {
		e := &nullEnv{}
		m := New(Config{Session: 1, MTU: 64, Window: 8, MaxMessage: 100}, e)
		m.Announce(0)
		for range 3 {
			m.Write(0, []byte("hello"), 0)
		}
		m.Flush(0)
		now := int64(time.Millisecond)
		buf := make([]byte, 200)
		// The packet, then the same as the stream's next packets (a
		// welcome first, so that a receiver reads).
		m.Handle(now, data)
		if len(data) >= CommonLen {
			hb := make([]byte, HeartbeatLen)
			PutHeartbeat(hb, Packet(data).Session(), 0, 0, FlagWelcome)
			m.Handle(now, hb)
		}
		m.Handle(now, data)
		for range 4 {
			now += int64(time.Millisecond)
			m.Tick(now)
			for {
				n, _, ok, err := m.Read(now, buf)
				if err == ErrShortBuffer && n > 100 {
					t.Fatalf("a record of %d bytes, over MaxMessage", n)
				}
				if !ok {
					break
				}
			}
			for {
				if _, ok := m.NextEvent(); !ok {
					break
				}
			}

		}
	})
}
