package fabric

import (
	"errors"
	"reflect"
	"testing"

	"github.com/softrdma/softrdma/wire"
)

func TestFlowCodec(t *testing.T) {
	for _, f := range []Flow{{}, {Op: FlowOpRequest, FCTBS: 0xFFF, FCCL: 0x123}, {FCTBS: 7, FCCL: 0x800}} {
		var b [FlowLen]byte
		enc := EncodeFlow(b[:], f)
		if !IsFlow(enc) || IsControl(enc) {
			t.Fatalf("%+v: IsFlow %v IsControl %v", f, IsFlow(enc), IsControl(enc))
		}
		got, err := DecodeFlow(enc)
		if err != nil || got != f {
			t.Fatalf("decode %x = %+v, %v; want %+v", enc, got, err, f)
		}
		for i := range enc { // every single-bit error is caught by the LPCRC (or VL)
			for bit := range 8 {
				c := append([]byte(nil), enc...)
				c[i] ^= 1 << bit
				if _, err := DecodeFlow(c); !errors.Is(err, ErrFlow) {
					t.Fatalf("%x with bit %d of byte %d flipped: %v", enc, bit, i, err)
				}
			}
		}
	}
	// A data packet is never taken for a flow control packet.
	if IsFlow(make([]byte, PacketLen(0, false, false))) {
		t.Fatal("an empty UD packet is a flow control packet")
	}
}

func TestCredits(t *testing.T) {
	for _, c := range []struct {
		fctbs, fccl uint16
		want        int
	}{
		{0, 0, 0}, {0, 1, 1}, {10, 20, 10}, {4090, 5, 11}, // wraps
		{0, MaxWindow, MaxWindow}, {0, MaxWindow + 1, 0}, // beyond the window: sent past the limit
		{20, 10, 0},
	} {
		if got := Credits(c.fctbs, c.fccl); got != c.want {
			t.Errorf("Credits(%d, %d) = %d, want %d", c.fctbs, c.fccl, got, c.want)
		}
	}
}

// TestLinkExchange runs two ends of a link: the transmitter stops when
// its credit is used up, the receiver's grants move it on, and a lost
// packet does not leak credit (the FCTBS of the next flow control packet
// resets ABR).
func TestLinkExchange(t *testing.T) {
	var tx, rx Link
	const win = 8
	tx.Reset(win, 0)
	rx.Reset(0, win)
	if tx.Credits() != win {
		t.Fatalf("credits %d, want %d", tx.Credits(), win)
	}
	tx.Sent(win)
	if tx.Credits() != 0 {
		t.Fatalf("credits after %d packets: %d", win, tx.Credits())
	}
	// The receiver took 7 of 8 (one was lost on the way) and freed them.
	rx.Took(win - 1)
	if !rx.Grant(win, win/4) {
		t.Fatal("no grant after a full window")
	}
	if tx.Receive(rx.Flow(FlowOpNormal)); tx.Credits() != win-1 {
		t.Fatalf("credits %d, want %d (the lost packet still counts)", tx.Credits(), win-1)
	}
	// The transmitter asks; its FCTBS resets the receiver's ABR and the
	// answer gives the lost packet's credit back.
	rx.Receive(tx.Flow(FlowOpRequest))
	if tx.Receive(rx.Answer(win)); tx.Credits() != win {
		t.Fatalf("credits %d after the answer, want %d", tx.Credits(), win)
	}
	// Grant never moves back, and waits for a step.
	if rx.Grant(win-1, 1) || rx.Grant(win, 1) {
		t.Fatal("grant without new free buffer")
	}
	rx.Took(1)
	if rx.Grant(win, 2) || !rx.Due(win, 1) || !rx.Grant(win, 1) {
		t.Fatal("grant steps")
	}
	// A link whose peer takes no part is never out of credit.
	var off Link
	off.Reset(0, win)
	off.Sent(5000)
	if off.Credits() == 0 {
		t.Fatal("a link without flow control ran out of credit")
	}
}

func TestWindow(t *testing.T) {
	if w := Window(8<<20, 1); w != DefaultWindow {
		t.Errorf("Window(8 MiB, 1) = %d", w)
	}
	if w := Window(425984, 1); w != 425984/PacketBufferCost {
		t.Errorf("Window(416 KiB, 1) = %d", w)
	}
	if w := Window(425984, 1000); w != MinWindow {
		t.Errorf("Window(416 KiB, 1000) = %d", w)
	}
}

// TestParseBuilt: ParseBuilt splits a packet as Parse does and skips only
// the CRCs.
func TestParseBuilt(t *testing.T) {
	h := &UDPacket{DLID: 0xC001, SLID: 2, Global: true, GRH: wire.IBGRHFields{HopLmt: 1},
		UD: wire.UDHeader{PKey: 0xFFFF, DestQP: wire.MulticastQPN, QKey: 7, SrcQP: 9}}
	b := make([]byte, PacketLen(5, false, true))
	EncodeUD(b, h, []byte("hello"))
	var p1, p2 Packet
	if err := Parse(b, &p1); err != nil {
		t.Fatal(err)
	}
	if err := ParseBuilt(b, &p2); err != nil || !reflect.DeepEqual(p1, p2) {
		t.Fatalf("ParseBuilt: %v, %+v != %+v", err, p2, p1)
	}
	b[len(b)-1] ^= 1 // the VCRC
	if err := Parse(b, &p1); !errors.Is(err, ErrVCRC) {
		t.Fatalf("Parse of a bad VCRC: %v", err)
	}
	if err := ParseBuilt(b, &p2); err != nil {
		t.Fatalf("ParseBuilt checks the VCRC: %v", err)
	}
	if err := ParseBuilt(b[:10], &p2); !errors.Is(err, ErrShort) {
		t.Fatalf("ParseBuilt of a short packet: %v", err)
	}
}
