package rxe

import (
	"errors"
	"net/netip"
	"slices"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/softrdma/softrdma/internal/sys/mmsg"
	"github.com/softrdma/softrdma/internal/sys/rawudp"
	"github.com/softrdma/softrdma/provider/softverbs"
	"github.com/softrdma/softrdma/verbs"
)

// membership is the device's IP multicast membership of one group on its
// interface. It lives while the RDMA CM holds references (IncGroup) or a
// verbs group of that MGID has attached QPs.
type membership struct {
	addr   netip.Addr
	cmRefs int                             // IncGroup references (Device.mu)
	sock   *recvSock                       // the socket holding the kernel membership
	grp    atomic.Pointer[softverbs.Group] // the attached QPs' group, if any
}

// alive reports whether anything still needs the membership.
func (m *membership) alive() bool { return m.cmRefs > 0 || m.grp.Load() != nil }

// recvSock is one UDP 4791 receive socket with its receive goroutine.
type recvSock struct {
	v6      bool
	conn    *rawudp.Conn
	peer    peerKey                       // a peer socket's peer (peers.go); zero for the others
	errSaid atomic.Bool                   // an error of the socket was logged (sockerr.go)
	uin     *uinput                       // a unicast socket's entry in the device's unicast inputs
	drops   atomic.Uint32                 // the kernel's drop count of the socket already counted (socket_drops)
	mships  atomic.Pointer[[]*membership] // immutable; read by the goroutine
	list    []*membership                 // Device.mu
	full    bool                          // the kernel refused one more group
	idle    *time.Timer                   // closes the socket while it lingers empty (Device.mu)
	idleGen uint64                        // which idle timer is current (Device.mu)
}

// IncGroup takes a reference on the device's membership of the IP
// multicast group (IPv4 224.0.0.0/4 or IPv6 ff00::/8; IPv4-mapped
// addresses count as IPv4). The first reference joins the group on the
// interface, which makes the kernel send an IGMP/MLD report; the device
// then receives the group's datagrams. The RDMA CM calls it for full-member
// joins. EINVAL for a non-multicast address, ENODEV on a closed device.
func (d *Device) IncGroup(group netip.Addr) error {
	group = group.Unmap().WithZone("")
	if !group.IsMulticast() {
		return d.errf(syscall.EINVAL, "join %v: not a multicast address", group)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return d.errf(syscall.ENODEV, "join %v: device closed", group)
	}
	m, err := d.membershipLocked(group)
	if err != nil {
		return err
	}
	m.cmRefs++
	return nil
}

// DecGroup drops a reference taken with IncGroup; the last reference (when
// no QP of the device is attached to the group either) leaves the group,
// and the kernel sends the leave report. EADDRNOTAVAIL when the device
// holds no IncGroup reference on the group.
func (d *Device) DecGroup(group netip.Addr) error {
	group = group.Unmap().WithZone("")
	d.mu.Lock()
	defer d.mu.Unlock()
	m := d.mships[group]
	if m == nil || m.cmRefs == 0 {
		return d.errf(syscall.EADDRNOTAVAIL, "leave %v: not joined", group)
	}
	m.cmRefs--
	d.releaseMembershipLocked(m)
	return nil
}

// Groups returns the IP multicast groups the device is a member of.
func (d *Device) Groups() []netip.Addr {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make([]netip.Addr, 0, len(d.mships))
	for a := range d.mships {
		out = append(out, a)
	}
	slices.SortFunc(out, func(a, b netip.Addr) int { return a.Compare(b) })
	return out
}

// membershipLocked returns the membership of group, joining it on a
// receive socket when it does not exist yet. The caller takes its
// reference (cmRefs or grp) before releasing d.mu.
func (d *Device) membershipLocked(group netip.Addr) (*membership, error) {
	if m := d.mships[group]; m != nil {
		return m, nil
	}
	// Memberships are bounded like groups (max_mcast_grp): each holds a
	// kernel membership, and every 20 a socket and a goroutine.
	if len(d.mships) >= d.limits.MaxMcastGrp {
		return nil, d.errf(syscall.ENOMEM, "join %v: %d IP memberships (max_mcast_grp)", group, len(d.mships))
	}
	m := &membership{addr: group}
	if err := d.joinLocked(m); err != nil {
		return nil, err
	}
	d.mships[group] = m
	return m, nil
}

// releaseMembershipLocked leaves the group when nothing needs it any more.
func (d *Device) releaseMembershipLocked(m *membership) {
	if m.alive() || d.mships[m.addr] != m {
		return
	}
	delete(d.mships, m.addr)
	s := m.sock
	if s == nil {
		return
	}
	m.sock = nil
	leaveGroup(s.conn, m.addr, d.ifindex) // errors: the socket closes anyway when empty
	s.list = slices.DeleteFunc(s.list, func(x *membership) bool { return x == m })
	s.publish()
	s.full = false
	if len(s.list) > 0 {
		return
	}
	if !d.closed && !d.hasSpareLocked(s.v6) {
		// Keep the socket for a while: a join right after the last leave
		// (or at the boundary of a socket's membership limit) then does
		// not pay for a new socket and goroutine.
		s.idleGen++
		gen := s.idleGen
		s.idle = time.AfterFunc(spareLinger, func() { d.closeSpare(s, gen) })
		return
	}
	d.closeRecvSockLocked(s)
}

// spareLinger is how long a receive socket stays open after its last
// membership left.
const spareLinger = time.Second

// hasSpareLocked reports whether an empty receive socket of the family
// lingers.
func (d *Device) hasSpareLocked(v6 bool) bool {
	for _, s := range d.rsocks {
		if s.v6 == v6 && s.idle != nil {
			return true
		}
	}
	return false
}

// closeSpare closes a lingering socket when its time is up, unless it was
// reused (or closed) since.
func (d *Device) closeSpare(s *recvSock, gen uint64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if s.idle == nil || s.idleGen != gen || len(s.list) > 0 || !slices.Contains(d.rsocks, s) {
		return
	}
	d.closeRecvSockLocked(s)
}

// closeRecvSockLocked closes a receive socket (its goroutine exits).
func (d *Device) closeRecvSockLocked(s *recvSock) {
	if s.idle != nil {
		s.idle.Stop()
		s.idle = nil
	}
	d.closeSock(s)
	d.rsocks = slices.DeleteFunc(d.rsocks, func(x *recvSock) bool { return x == s })
	d.closeGuardIdleLocked()
}

// joinLocked adds the kernel membership of m.addr to a receive socket with
// room, opening a new socket (and its goroutine) when all are full.
func (d *Device) joinLocked(m *membership) error {
	v6 := m.addr.Is6()
	per := membershipsPerSocket()
	for _, s := range d.rsocks {
		if s.v6 != v6 || s.full || len(s.list) >= per {
			continue
		}
		err := joinGroup(s.conn, m.addr, d.ifindex)
		if err == nil {
			if s.idle != nil {
				s.idle.Stop()
				s.idle = nil
			}
			s.add(m)
			return nil
		}
		if !isSocketFull(err) {
			return d.errf(verbs.ErrnoOf(err), "join %v: %v", m.addr, err)
		}
		s.full = true
	}
	s, err := d.openRecvSockLocked(v6)
	if err != nil {
		return d.errf(verbs.ErrnoOf(err), "join %v: receive socket: %v", m.addr, err)
	}
	if err := joinGroup(s.conn, m.addr, d.ifindex); err != nil {
		s.conn.Close()
		d.rsocks = slices.DeleteFunc(d.rsocks, func(x *recvSock) bool { return x == s })
		d.closeGuardIdleLocked()
		return d.errf(verbs.ErrnoOf(err), "join %v: %v", m.addr, err)
	}
	s.add(m)
	return nil
}

func (s *recvSock) add(m *membership) {
	m.sock = s
	s.list = append(s.list, m)
	s.publish()
}

func (s *recvSock) publish() {
	l := slices.Clone(s.list)
	s.mships.Store(&l)
}

// lookup finds the membership of group dst among the socket's (lock-free).
func (s *recvSock) lookup(dst netip.Addr) *membership {
	for _, m := range *s.mships.Load() {
		if m.addr == dst {
			return m
		}
	}
	return nil
}

// openRecvSockLocked opens a receive socket and starts its goroutine.
func (d *Device) openRecvSockLocked(v6 bool) (*recvSock, error) {
	conn, err := openRecvConn(v6)
	if err != nil {
		return nil, err
	}
	s := &recvSock{v6: v6, conn: conn}
	s.publish()
	br, err := newBatchReader(conn)
	if err != nil {
		conn.Close()
		return nil, err
	}
	if !v6 {
		d.openGuardLocked()
	}
	rx := newReceiver(d, s, br)
	d.rsocks = append(d.rsocks, s)
	d.wg.Add(1)
	go d.receiveLoop(rx)
	return s, nil
}

// receiveLoop is the goroutine of one receive socket. An end other than
// the socket's close is logged and counted (loopEnded).
func (d *Device) receiveLoop(rx *receiver) {
	defer d.wg.Done()
	if err := rx.run(); !closedErr(err) {
		d.loopEnded(rx.s, err)
	}
}

// openUnicastLocked opens the device's unicast receive sockets: UDP 4791
// sockets (IPv4, and IPv6 when v6) that hold no membership, so that the
// host has a socket on 4791 for the replies to the device's QPs even
// while no process of the host holds a membership. Best effort (without
// them, the membership sockets of every device of the user still read
// unicast datagrams and hand them over), except when another user holds
// the port: then no datagram could reach the device, and the error says
// whose the port is.
func (d *Device) openUnicastLocked(v6 bool) error {
	for _, fam6 := range []bool{false, true} {
		if fam6 && !v6 {
			continue
		}
		conn, err := openRecvConn(fam6)
		if err != nil {
			if errors.Is(err, syscall.EADDRINUSE) {
				return d.errf(syscall.EADDRINUSE, "unicast receive socket: %v", err)
			}
			continue
		}
		s := &recvSock{v6: fam6, conn: conn}
		s.publish()
		br, err := newBatchReader(conn)
		if err != nil {
			conn.Close()
			continue
		}
		if !fam6 {
			d.openGuardLocked()
		}
		d.startUnicastLocked(s, br)
	}
	d.startPeersLocked()
	return nil
}

// startUnicastLocked adds s, read by br, to the device's unicast receive
// sockets and inputs and starts its goroutine (d.mu held).
func (d *Device) startUnicastLocked(s *recvSock, br *mmsg.Reader) {
	d.usocks = append(d.usocks, s)
	rx := newReceiver(d, s, br)
	rx.in = &uinput{br: br}
	s.uin = rx.in
	d.addInputLocked(rx.in)
	d.wg.Add(1)
	go d.unicastLoop(rx)
}

// closeUnicastLocked closes the unicast receive sockets (their goroutines
// exit).
func (d *Device) closeUnicastLocked() {
	d.stopPeersLocked()
	for _, s := range d.usocks {
		d.removeInputLocked(s.uin)
		d.closeSock(s)
	}
	d.usocks = nil
	d.closeGuardIdleLocked()
}

// unicastLoop is the goroutine of one unicast receive socket. An end
// other than the socket's close is logged and counted, and the socket
// closed (unicastEnded): the kernel would go on queueing datagrams to a
// socket nobody reads.
func (d *Device) unicastLoop(rx *receiver) {
	defer d.wg.Done()
	if err := rx.run(); !closedErr(err) {
		d.loopEnded(rx.s, err)
		d.unicastEnded(rx.s)
	}
}
