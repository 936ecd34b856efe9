package interop

import (
	"net/netip"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/softrdma/softrdma/test/nettest"
	"github.com/softrdma/softrdma/wire"
)

// crafter sends hand-built RoCEv2 datagrams from the softrdma namespace
// through an unconnected UDP socket with IP_PMTUDISC_DO: the kernel then
// sends DF=1 and IP ID 0, so the ICRC can be computed before sending.
type crafter struct {
	fd    int
	src   netip.Addr
	sport uint16
	psn   uint32
}

func newCrafter(t *testing.T, l *lab) *crafter {
	t.Helper()
	c := &crafter{fd: -1, src: l.hostAddr}
	err := nettest.InNetns(l.h0, func() error {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		c.fd = fd
		if err := unix.Bind(fd, &unix.SockaddrInet4{Addr: l.hostAddr.As4()}); err != nil {
			return err
		}
		for _, o := range []struct{ level, opt, v int }{
			{unix.IPPROTO_IP, unix.IP_MTU_DISCOVER, unix.IP_PMTUDISC_DO},
			{unix.IPPROTO_IP, unix.IP_MULTICAST_TTL, 64},
			{unix.IPPROTO_IP, unix.IP_MULTICAST_LOOP, 0},
			{unix.SOL_SOCKET, unix.SO_NO_CHECK, 1},
		} {
			if err := unix.SetsockoptInt(fd, o.level, o.opt, o.v); err != nil {
				return err
			}
		}
		if err := unix.SetsockoptInet4Addr(fd, unix.IPPROTO_IP, unix.IP_MULTICAST_IF, l.hostAddr.As4()); err != nil {
			return err
		}
		sa, err := unix.Getsockname(fd)
		if err != nil {
			return err
		}
		c.sport = uint16(sa.(*unix.SockaddrInet4).Port)
		return nil
	})
	if err != nil {
		if c.fd >= 0 {
			unix.Close(c.fd)
		}
		t.Fatalf("crafter socket in %s: %v", l.h0, err)
	}
	t.Cleanup(func() { unix.Close(c.fd) })
	return c
}

// frame builds the UDP payload of a UD SEND_ONLY (with imm when hasImm) to
// group: DestQP 0xffffff, the given Q_Key and SrcQP, a valid ICRC for the
// IPv4 and UDP headers the kernel will put in front of it.
func (c *crafter) frame(group netip.Addr, qkey, srcQP uint32, hasImm bool, payload []byte) []byte {
	h := wire.UDHeader{PKey: 0xffff, DestQP: 0xffffff, PSN: c.psn, QKey: qkey, SrcQP: srcQP, HasImm: hasImm, Imm: srcQP}
	c.psn++
	b := make([]byte, wire.UDLen(len(payload), hasImm))
	n := wire.EncodeUD(b, &h, payload)
	ip := make(wire.IPv4, wire.IPv4HeaderLen)
	ip.Encode(wire.IPv4Fields{
		TotalLength: uint16(wire.IPv4HeaderLen + wire.UDPHeaderLen + len(b)),
		ID:          0, DF: true, TTL: 64, Protocol: wire.IPProtocolUDP,
		Src: c.src, Dst: group,
	})
	udp := make(wire.UDP, wire.UDPHeaderLen)
	udp.Encode(c.sport, wire.UDPPort, uint16(wire.UDPHeaderLen+len(b)))
	wire.PutICRC(b[n:], wire.ICRCv4(ip, udp, b[:n]))
	return b
}

func (c *crafter) send(t *testing.T, group netip.Addr, b []byte) {
	t.Helper()
	if err := unix.Sendto(c.fd, b, 0, &unix.SockaddrInet4{Port: wire.UDPPort, Addr: group.As4()}); err != nil {
		t.Fatalf("sendto %v: %v", group, err)
	}
}
