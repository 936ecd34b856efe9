package ib

import (
	"fmt"
	"net/netip"
	"syscall"

	"github.com/softrdma/softrdma/ib/fabric"
	"github.com/softrdma/softrdma/verbs"
	"github.com/softrdma/softrdma/wire"
)

// A port trusts only its subnet manager: every datagram on the fabric
// socket must come from the SM's fabric address (the SM is also the
// switch, so every IB packet comes from there too). Datagrams from any
// other address are dropped and counted (ForeignDrops), control messages
// or packets alike. A port_info is taken only when its fields are sane
// (validPortInfo); otherwise it is dropped and counted (ControlDrops). A
// refused is taken only when it names the port's GUID and the port never
// had a port_info (Open is waiting): it ends Open at once (refused). Later
// ones are dropped and counted: an active port that the SM stopped
// answering notices it by its keepalives (PortError). A retry is taken
// only when it names the port's GUID and carries a cookie of 1 to
// fabric.MaxCookieLen bytes; the port keeps the last cookie for its
// attaches until a port_info comes, and answers the first retry after each
// of its keepalives at once with an attach carrying the cookie: a retry
// costs one round trip at attach, and forged or repeated retries make the
// port send at most one more attach per keepalive (so they cannot push its
// attaches over the SM's ControlRate for its address).
// SA answers are further matched by the host's SA client (TID, response
// method, attribute, source LID and QP).

// fromSM reports whether a datagram's source is the port's SM.
func (d *Device) fromSM(from netip.AddrPort) bool {
	return netip.AddrPortFrom(from.Addr().Unmap(), from.Port()) == d.smAddr
}

// unicastLID reports whether lid may be a port's LID: not 0, not a
// multicast LID, not the permissive LID.
func unicastLID(lid uint16) bool { return lid != 0 && lid < wire.MulticastLIDBase }

// validPortInfo checks a port_info from the SM: it names this port, gives
// it a unicast LID other than the SM's, a unicast SM LID, an MTU the port
// supports (256..4096) and the active state.
func (d *Device) validPortInfo(c *fabric.Control) error {
	switch {
	case c.GUID != d.guid:
		return fmt.Errorf("port_info for GUID %#x", c.GUID)
	case !unicastLID(c.LID):
		return fmt.Errorf("port_info LID %#x is not a unicast LID", c.LID)
	case !unicastLID(c.SMLID):
		return fmt.Errorf("port_info SM LID %#x is not a unicast LID", c.SMLID)
	case c.LID == c.SMLID:
		return fmt.Errorf("port_info LID %#x is the SM's", c.LID)
	case verbs.MTU(c.MTU) < verbs.MTU256 || verbs.MTU(c.MTU) > verbs.MTU4096:
		return fmt.Errorf("port_info MTU %d", c.MTU)
	case c.State != fabric.StateActive:
		return fmt.Errorf("port_info state %q", c.State)
	case c.Epoch == 0:
		return fmt.Errorf("port_info without an epoch")
	}
	return nil
}

// retry takes the SM's retry: the port proves it receives at its address
// by sending an attach with the cookie (at once for the first retry after
// a keepalive, and in every keepalive until a port_info comes). It
// reports whether the message was taken. Receive goroutine.
func (d *Device) retry(c *fabric.Control) bool {
	if c.GUID != d.guid || len(c.Cookie) == 0 || len(c.Cookie) > fabric.MaxCookieLen {
		return false
	}
	d.mu.Lock()
	d.cookie = c.Cookie
	now := d.retryOK
	d.retryOK = false
	d.mu.Unlock()
	if now {
		d.sendAttach(false)
	}
	return true
}

// waiting reports whether Open waits for the first port_info (a refused
// is taken only then).
func (d *Device) waiting() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.epoch == 0 && d.refusal == nil
}

// refused takes the SM's refusal of the port's attach: it must name the
// port's GUID and come before the port's first port_info. Open then fails
// with the refusal's error. It reports whether the message was taken.
func (d *Device) refused(c *fabric.Control) bool {
	if c.GUID != d.guid {
		return false
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.epoch != 0 || d.refusal != nil {
		return false
	}
	switch c.Reason {
	case fabric.ReasonGUIDInUse:
		d.refusal = fmt.Errorf("GUID %#x is in use at another address on the subnet (refused by the subnet manager at %v): %w",
			d.guid, d.smAddr, syscall.EADDRINUSE)
	case fabric.ReasonNoLID:
		d.refusal = fmt.Errorf("the subnet has no free LID (refused by the subnet manager at %v): %w", d.smAddr, syscall.ENOSPC)
	case fabric.ReasonVersion:
		d.refusal = fmt.Errorf("the subnet manager at %v speaks another version of the fabric protocol (this port speaks %d): %w",
			d.smAddr, fabric.Version, syscall.EPROTONOSUPPORT)
	default:
		d.refusal = fmt.Errorf("the subnet manager at %v refused the port (reason %q): %w", d.smAddr, c.Reason, syscall.ECONNREFUSED)
	}
	close(d.refusedCh)
	return true
}
