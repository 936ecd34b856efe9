package ib_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/gopacket/gopacket/pcapgo"

	"github.com/softrdma/softrdma/capture"
	"github.com/softrdma/softrdma/ib/fabric"
	"github.com/softrdma/softrdma/verbs"
)

// syncBuffer is a bytes.Buffer safe for the capture's writer goroutine.
type syncBuffer struct {
	mu  chan struct{}
	buf bytes.Buffer
}

func newSyncBuffer() *syncBuffer { return &syncBuffer{mu: make(chan struct{}, 1)} }

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu <- struct{}{}
	defer func() { <-b.mu }()
	return b.buf.Write(p)
}

func (b *syncBuffer) Bytes() []byte {
	b.mu <- struct{}{}
	defer func() { <-b.mu }()
	return bytes.Clone(b.buf.Bytes())
}

// TestCaptureIB captures a unicast UD datagram between two ports: the
// sender's capture holds the packet it sent and the receiver's the one it
// read, as InfiniBand packets (LINKTYPE_INFINIBAND) that parse from the
// LRH on, with the receiver's DLID and QPN; tshark, when present, decodes
// them as InfiniBand.
func TestCaptureIB(t *testing.T) {
	s := startSM(t)
	a := openPort(t, s, "127.0.6.1")
	b := openPort(t, s, "127.0.6.2")
	sent, rcvd := newSyncBuffer(), newSyncBuffer()
	cs, err := capture.Start(sent, capture.Options{Device: a.dev.Name(), Direction: capture.Sent})
	if err != nil {
		t.Fatal(err)
	}
	cr, err := capture.Start(rcvd, capture.Options{Device: b.dev.Name(), Direction: capture.Received})
	if err != nil {
		t.Fatal(err)
	}
	ah, err := a.pd.CreateAH(&verbs.AHAttr{DLID: b.dev.LID(), PortNum: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer ah.Destroy()
	if err := a.qp.PostSend(&verbs.SendWR{Opcode: verbs.WRSend, UD: verbs.UDWR{AH: ah, RemoteQPN: b.qp.Num(), RemoteQKey: 0x01234567}}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var wc [1]verbs.WC
	for {
		if n, _ := b.cq.Poll(wc[:]); n == 1 {
			break
		}
		if err := b.cq.Wait(ctx); err != nil {
			t.Fatalf("no delivery: %v", err)
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for cs.Stats().Packets < 1 || cr.Stats().Packets < 1 {
		if time.Now().After(deadline) {
			t.Fatalf("captured sent %d, received %d", cs.Stats().Packets, cr.Stats().Packets)
		}
		time.Sleep(5 * time.Millisecond)
	}
	cs.Stop()
	cr.Stop()
	for name, buf := range map[string]*syncBuffer{"sent": sent, "received": rcvd} {
		r, err := pcapgo.NewReader(bytes.NewReader(buf.Bytes()))
		if err != nil || uint32(r.LinkType()) != verbs.LinkTypeInfiniBand {
			t.Fatalf("%s: %v, link type %v", name, err, r.LinkType())
		}
		found := false
		for {
			data, _, err := r.ReadPacketData()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			var p fabric.Packet
			if err := fabric.Parse(data, &p); err != nil {
				t.Errorf("%s: frame does not parse as an IB packet: %v", name, err)
				continue
			}
			if p.LRH.DLID() == b.dev.LID() && p.UD.BTH.DestQP() == b.qp.Num() {
				found = true
			}
		}
		if !found {
			t.Errorf("%s: no packet to LID %d QPN %#x", name, b.dev.LID(), b.qp.Num())
		}
		if tshark, err := exec.LookPath("tshark"); err == nil {
			checkTshark(t, tshark, name, buf.Bytes(), b.dev.LID())
		}
	}
}

// checkTshark decodes a capture with Wireshark's InfiniBand dissector and
// checks the DLID of its packets. Wireshark 4.0 (Debian 12's) does not map
// LINKTYPE_INFINIBAND in pcap files, so the header is relinked to USER0
// (147) and that link type mapped to the "infiniband" dissector; the
// frames themselves are as captured.
func checkTshark(t *testing.T, tshark, name string, pcap []byte, dlid uint16) {
	t.Helper()
	relinked := bytes.Clone(pcap)
	binary.LittleEndian.PutUint32(relinked[20:24], 147)
	cmd := exec.Command(tshark, "-o", `uat:user_dlts:"User 0 (DLT=147)","infiniband","0","","0",""`,
		"-r", "-", "-T", "fields", "-e", "frame.protocols", "-e", "infiniband.lrh.dlid")
	cmd.Stdin = bytes.NewReader(relinked)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s: tshark: %v", name, err)
	}
	want := fmt.Sprintf("\t%d", dlid)
	if !strings.Contains(string(out), "infiniband") || !strings.Contains(string(out), want) {
		t.Errorf("%s: tshark does not decode an InfiniBand packet to DLID %d: %q", name, dlid, out)
	}
}
