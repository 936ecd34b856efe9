package ib

import (
	"fmt"
	"slices"
	"syscall"
	"time"

	"github.com/softrdma/softrdma/ib/fabric"
	"github.com/softrdma/softrdma/provider/softverbs"
	"github.com/softrdma/softrdma/wire"
)

// The port's side of the host's SA client (driver.MADPort): it carries
// MADs to the SA and hands the MADs that arrive on QP1 to the agents.

// madAgent is one registered receiver of QP1's MADs.
type madAgent struct {
	id int
	fn func(slid uint16, srcQP uint32, mad []byte) bool
}

// SendSA sends a MAD to the SA as a UD packet to the SM LID, QP1
// (driver.MADPort).
func (d *Device) SendSA(m []byte) error {
	if !d.smTrusted.Load() {
		return fmt.Errorf("ib: send SA MAD: the subnet manager at %v is not authenticated: %w", d.smAddr, syscall.ENETDOWN)
	}
	d.mu.Lock()
	lid, smLID := d.lid, d.smLID
	d.mu.Unlock()
	p := fabric.UDPacket{
		DLID: smLID, SLID: lid,
		UD: wire.UDHeader{PKey: 0xffff, DestQP: gsiQPN, QKey: gsiQKey, SrcQP: gsiQPN},
	}
	b := make([]byte, fabric.PacketLen(len(m), false, false))
	n := fabric.EncodeUD(b, &p, m)
	return d.xmitManagement(b[:n])
}

// control handles a control message from the SM (receiveLoop checked the
// source): a valid port_info, or a refused for this port before its first
// port_info, each from an SM the port authenticates (smauth.go: else
// counted in UntrustedDrops). Anything else is dropped and counted.
func (d *Device) control(b []byte) {
	c, err := fabric.DecodeControl(b)
	switch {
	case err != nil:
	case c.Type == fabric.TypePortInfo && d.validPortInfo(c) == nil:
		if err := d.authenticate(c); err != nil {
			d.core.Count(softverbs.UntrustedDrops, 1)
			d.untrusted(err)
			return
		}
		d.smTrusted.Store(true)
		d.portInfo(c)
		return
	case c.Type == fabric.TypeRefused && c.GUID == d.guid && d.waiting():
		if err := d.authenticate(c); err != nil {
			d.core.Count(softverbs.UntrustedDrops, 1)
			d.untrusted(err)
			return
		}
		if d.refused(c) {
			return
		}
	case c.Type == fabric.TypeRetry && d.retry(c):
		return
	}
	d.core.Count(softverbs.ControlDrops, 1)
}

// SATimeout returns the port's configured SA wait and resends
// (Config.SATimeout, Config.SARetries; driver.MADPort).
func (d *Device) SATimeout() (time.Duration, int) { return d.cfg.SATimeout, d.cfg.SARetries }

// RegisterMADAgent hands every MAD arriving on QP1 to fn until unregister
// (driver.MADPort). A MAD no agent takes is counted in SAStrayDrops.
func (d *Device) RegisterMADAgent(fn func(slid uint16, srcQP uint32, mad []byte) bool) (unregister func()) {
	d.mu.Lock()
	id := d.nextSub
	d.nextSub++
	d.setAgentsLocked(append(d.madAgents(), madAgent{id, fn}))
	d.mu.Unlock()
	return func() {
		d.mu.Lock()
		d.setAgentsLocked(slices.DeleteFunc(d.madAgents(), func(a madAgent) bool { return a.id == id }))
		d.mu.Unlock()
	}
}

// madAgents returns a copy of the agents (d.mu held by writers).
func (d *Device) madAgents() []madAgent {
	if p := d.agents.Load(); p != nil {
		return slices.Clone(*p)
	}
	return nil
}

func (d *Device) setAgentsLocked(a []madAgent) { d.agents.Store(&a) }

// deliverMAD offers a MAD from QP1 to the agents; false when none took it.
func (d *Device) deliverMAD(slid uint16, srcQP uint32, mad []byte) bool {
	p := d.agents.Load()
	if p == nil {
		return false
	}
	for _, a := range *p {
		if a.fn(slid, srcQP, mad) {
			return true
		}
	}
	return false
}
