package ib

import (
	"time"

	"golang.org/x/sys/unix"

	"github.com/softrdma/softrdma/ib/fabric"
	"github.com/softrdma/softrdma/internal/sys/rawudp"
	"github.com/softrdma/softrdma/provider/softverbs"
)

// The port's link to the switch is flow controlled as an IB link is (see
// ib/fabric's flow control): a send waits for credit from the switch
// instead of overrunning it, and the port grants the switch credit for
// its own receive buffer. The transmit side (link.On, FCTBS, FCCL, the
// waiting and the stall) is guarded by lmu; the receive side (ABR,
// Granted) belongs to the receive goroutine, which takes lmu to change
// Granted and to send its flow control packets (after every data packet
// counted in their FCTBS).

// socketBuffer asks for a large receive buffer and returns what the
// kernel gave (SO_RCVBUF as getsockopt reports it).
func socketBuffer(c *rawudp.Conn) int {
	c.SetReadBuffer(fabric.SocketBuffer)
	raw, err := c.SyscallConn()
	if err != nil {
		return 0
	}
	var v int
	raw.Control(func(fd uintptr) { v, _ = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF) })
	return v
}

// switchWindow is the window the port grants the switch for a receive
// buffer of rcvbuf bytes: what the buffer holds beside the windows of the
// direct peers may take (fabric.DirectBudget).
func switchWindow(rcvbuf int) int {
	w := fabric.Window(rcvbuf, 1)
	if room := rcvbuf/fabric.PacketBufferCost - fabric.DirectBudget(rcvbuf); w > room {
		w = max(room, fabric.MinWindow)
	}
	return w
}

// resetLink starts the link's counts anew with peerWindow credits from
// the switch (0: no flow control). Receive goroutine.
func (d *Device) resetLink(peerWindow int) {
	d.lmu.Lock()
	d.link.Reset(peerWindow, d.rxWin)
	d.linkOn.Store(d.link.On)
	d.stalled = false
	d.creditMoved()
	d.lmu.Unlock()
}

// creditMoved wakes the senders waiting for credit. lmu is held.
func (d *Device) creditMoved() {
	close(d.linkCh)
	d.linkCh = make(chan struct{})
}

// sendFlow sends the port's flow control packet. lmu is held.
func (d *Device) sendFlow(f fabric.Flow) {
	var b [fabric.FlowLen]byte
	d.conn.WriteToUDPAddrPort(fabric.EncodeFlow(b[:], f), d.smDst)
}

// flowIn applies a flow control packet from the switch. Receive goroutine.
func (d *Device) flowIn(b []byte) {
	f, err := fabric.DecodeFlow(b)
	d.lmu.Lock()
	defer d.lmu.Unlock()
	if err != nil || !d.link.On {
		d.core.Count(softverbs.ControlDrops, 1)
		return
	}
	if d.link.Receive(f) {
		d.stalled = false
		d.creditMoved()
	}
	if f.Op == fabric.FlowOpRequest {
		d.sendFlow(d.link.Answer(d.rxWin))
	}
}

// took counts a data packet taken from the switch and grants the switch
// credit for it once a quarter of the window is free again. Receive
// goroutine.
func (d *Device) took() {
	d.link.Took(1)
	if !d.linkOn.Load() || !d.link.Due(d.rxWin, d.rxWin/4) {
		return
	}
	d.lmu.Lock()
	if d.link.Grant(d.rxWin, d.rxWin/4) {
		d.sendFlow(d.link.Flow(fabric.FlowOpNormal))
	}
	d.lmu.Unlock()
}

// xmit sends data packets to the switch, each when the link has credit
// for it; pkts are sent with one write per packet or, through send, all
// at once. It waits for credit at most Config.LinkStallTimeout; then the
// link is stalled: the packets without credit are dropped (counted in
// LinkStallDrops), and so is every packet until credit comes. It returns
// how many packets went out (the rest were dropped) and the first send
// error.
func (d *Device) xmit(n int, send func(from, to int) (int, error)) (sent int, err error) {
	d.lmu.Lock()
	defer d.lmu.Unlock()
	var deadline time.Time
	var t *time.Timer
	defer func() {
		if t != nil {
			t.Stop()
		}
	}()
	for sent < n {
		c := d.link.Credits()
		if c == 0 {
			now := time.Now()
			if deadline.IsZero() && !d.stalled {
				// Counted before the request goes out: whoever sees the
				// request sees the wait.
				d.core.Count(softverbs.LinkWaits, 1)
				deadline = now.Add(d.cfg.LinkStallTimeout)
			}
			if now.Sub(d.lastReq) >= fabric.FlowRefresh {
				d.lastReq = now
				d.sendFlow(d.link.Flow(fabric.FlowOpRequest))
			}
			if d.stalled {
				d.core.Count(softverbs.LinkStallDrops, uint64(n-sent))
				return sent, err
			}
			if !now.Before(deadline) {
				d.stalled = true
				continue
			}
			wait := min(deadline.Sub(now), fabric.FlowRefresh)
			if t == nil {
				t = time.NewTimer(wait)
			} else {
				t.Reset(wait)
			}
			ch := d.linkCh
			d.lmu.Unlock()
			select {
			case <-ch:
			case <-t.C:
			case <-d.done:
			}
			d.lmu.Lock()
			select {
			case <-d.done:
				d.core.Count(softverbs.LinkStallDrops, uint64(n-sent))
				return sent, err
			default:
			}
			continue
		}
		k, e := send(sent, min(n, sent+c))
		d.link.Sent(k)
		sent += k
		if e != nil {
			// The packet the kernel refused is not on the link.
			return sent, e
		}
	}
	return sent, err
}

// xmitManagement sends a management packet (an SA MAD) without waiting
// for credit, counted on the link: the switch keeps room for a few.
func (d *Device) xmitManagement(pkt []byte) error {
	d.lmu.Lock()
	defer d.lmu.Unlock()
	d.link.Sent(1)
	_, err := d.conn.WriteToUDPAddrPort(pkt, d.smDst)
	return err
}
