package ib

import (
	"github.com/softrdma/softrdma/ib/fabric"
	"github.com/softrdma/softrdma/ib/mcast"
	"github.com/softrdma/softrdma/provider/softverbs"
	"github.com/softrdma/softrdma/wire"
)

// GroupRecord is a decoded MCMemberRecord (mcast.GroupRecord).
type GroupRecord = mcast.GroupRecord

// IPoIBBroadcastMGID is the default partition's IPoIB IPv4 broadcast group.
var IPoIBBroadcastMGID = mcast.IPoIBBroadcastMGID

// SendSA implements mcast.Port: it sends a MAD to the SA as a UD packet to
// the SM LID, QP1.
func (d *Device) SendSA(m []byte) error {
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
// port_info. Anything else is dropped and counted.
func (d *Device) control(b []byte) {
	c, err := fabric.DecodeControl(b)
	switch {
	case err != nil:
	case c.Type == fabric.TypePortInfo && d.validPortInfo(c) == nil:
		d.portInfo(c)
		return
	case c.Type == fabric.TypeRefused && d.refused(c):
		return
	case c.Type == fabric.TypeRetry && d.retry(c):
		return
	}
	d.core.Count(softverbs.ControlDrops, 1)
}
