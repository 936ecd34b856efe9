package sma

import (
	"slices"

	"github.com/softrdma/softrdma/ib/mad"
)

// Tables is a snapshot of what the subnet's SM set that a switch forwards
// by: the switch's linear and multicast forwarding tables, which CA port
// hangs off each switch port, and the SM host's LID. A Tables is never
// changed once Fabric.Tables returned it (the Fabric publishes a new one
// after every SMP that set something, and after the list of CA ports
// changed), so that a forwarder reads it without a lock.
type Tables struct {
	// Version counts the snapshots a Fabric published (from 1).
	Version uint64
	// HostLID is the SM host's port's LID (0 until the SM set one): the
	// SM's and its SA's LID.
	HostLID uint16
	// LFT is the linear forwarding table up to LinearFDBTop: entry l is
	// the switch port for LID l, 0xFF for none.
	LFT []byte
	// MFT is the multicast forwarding table by MLID-0xC000: the port
	// mask words of an MLID (word w: switch ports 16w..16w+15), nil for
	// an MLID without ports.
	MFT [][]uint16
	// Ports is, by switch port number, the GUID of the CA port linked to
	// it (port 1: the SM host's port; 0: none, and for port 0).
	Ports []uint64
}

// UnicastPort returns the switch port the LFT gives dlid (-1: none, or
// not a unicast LID).
func (t *Tables) UnicastPort(dlid uint16) int {
	if dlid == 0 || int(dlid) >= len(t.LFT) {
		return -1
	}
	p := int(t.LFT[dlid])
	if p == 0xFF || p >= len(t.Ports) {
		return -1
	}
	return p
}

// MulticastMask returns mlid's port mask words (nil: none, or not a
// multicast LID in the table).
func (t *Tables) MulticastMask(mlid uint16) []uint16 {
	if mlid < 0xC000 || int(mlid-0xC000) >= len(t.MFT) {
		return nil
	}
	return t.MFT[mlid-0xC000]
}

// Tables returns the latest snapshot (never nil).
func (f *Fabric) Tables() *Tables { return f.tables.Load() }

// Changes returns a channel that gets a value (at most one waits) after
// each new snapshot: the SM set something (a LID, a port state, a
// ClientReregister, a table block) or the list of CA ports changed.
func (f *Fabric) Changes() <-chan struct{} { return f.changes }

// publishLocked publishes a new snapshot when something changed since the
// last one. Caller holds f.mu.
func (f *Fabric) publishLocked() {
	if !f.dirty && f.tables.Load() != nil {
		return
	}
	f.dirty = false
	t := &Tables{HostLID: mad.PortInfo(f.host.ports[1].pi[:]).LID()}
	if old := f.tables.Load(); old != nil {
		t.Version = old.Version + 1
	} else {
		t.Version = 1
	}
	top := int(mad.SwitchInfo(f.sw.sw.info[:]).LinearFDBTop())
	t.LFT = slices.Clone(f.sw.sw.lft[:min(top+1, len(f.sw.sw.lft))])
	t.MFT = make([][]uint16, len(f.sw.sw.mft))
	for i, e := range f.sw.sw.mft {
		for _, w := range e {
			if w != 0 {
				t.MFT[i] = slices.Clone(e)
				break
			}
		}
	}
	t.Ports = make([]uint64, len(f.sw.ports))
	for i, p := range f.sw.ports {
		if i > 0 && p.peer != nil {
			t.Ports[i] = p.peer.guid
		}
	}
	f.tables.Store(t)
	select {
	case f.changes <- struct{}{}:
	default:
	}
}
