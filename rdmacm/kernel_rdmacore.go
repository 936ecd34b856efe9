//go:build rdmacore && cgo

package rdmacm

import (
	"net"
	"net/netip"
	"strconv"
	"syscall"
	"time"

	"github.com/softrdma/softrdma/provider/rdmacore"
	"github.com/softrdma/softrdma/verbs"
)

// The kernel's stack through librdmacm (provider/rdmacore). This file is
// the only code of rdmacm that knows rdmacore, as port_rxe.go and
// port_ib.go are for softrdma's providers.

func init() { kernel = librdmacm{} }

type librdmacm struct{}

func (librdmacm) newChannel() (kernelChannel, error) {
	c, err := rdmacore.NewCMChannel()
	if err != nil {
		return nil, err
	}
	return kchan{c}, nil
}

type kchan struct{ c *rdmacore.CMChannel }

func (k kchan) createID(tok uint64, ps PortSpace) (kernelID, error) {
	id, err := k.c.CreateID(tok, uint16(ps))
	if err != nil {
		return nil, err
	}
	return kid{id}, nil
}

func (k kchan) ownerOf(a netip.Addr) string {
	fam := syscall.AF_INET6
	if a.Is4() {
		fam = syscall.AF_INET
	}
	return k.c.OwnerOf(rdmacore.Sockaddr{Family: fam, IP: a}.Marshal())
}

func (k kchan) next() (*kernelEvent, error) {
	ev, err := k.c.Next()
	if err != nil {
		return nil, err
	}
	return &kernelEvent{
		typ: EventType(ev.Type), status: ev.Status, idTok: ev.IDToken, mcTok: ev.MCToken,
		qpn: ev.QPNum, qkey: ev.QKey, ah: ev.AHAttr, pdLen: ev.PrivateDataLen, ack: ev.Ack,
	}, nil
}

func (k kchan) close() error { return k.c.Close() }

type kid struct{ id *rdmacore.CMID }

// raw returns the C bytes of a socket address; nil for none.
func raw(sa *sockaddr) []byte {
	if sa == nil {
		return nil
	}
	s := rdmacore.Sockaddr{Family: sa.family, IP: sa.ip, Port: sa.port}
	switch sa.family {
	case syscall.AF_INET6:
		if z := sa.ip.Zone(); z != "" {
			if ifi, err := interfaceIndex(z); err == nil {
				s.Scope = uint32(ifi)
			}
		}
	case afIB:
		s = rdmacore.Sockaddr{
			Family: rdmacore.AFIB, PKey: sa.ib.PKey, FlowInfo: sa.ib.FlowInfo, GID: sa.ib.GID,
			SID: sa.ib.SID, SIDMask: sa.ib.SIDMask, IBScope: sa.ib.ScopeID,
		}
	}
	return s.Marshal()
}

// fromRaw converts the C bytes of a socket address.
func fromRaw(b []byte) sockaddr {
	s, ok := rdmacore.ParseSockaddr(b)
	if !ok {
		return sockaddr{}
	}
	if s.Family == rdmacore.AFIB {
		return sockaddr{family: afIB, ib: IBAddr{PKey: s.PKey, FlowInfo: s.FlowInfo, GID: s.GID, SID: s.SID, SIDMask: s.SIDMask, ScopeID: s.IBScope}}
	}
	ip := s.IP
	if s.Family == syscall.AF_INET6 && s.Scope != 0 {
		if name, err := interfaceName(int(s.Scope)); err == nil {
			ip = ip.WithZone(name)
		}
	}
	return sockaddr{family: s.Family, ip: ip, port: s.Port}
}

func (k kid) bind(sa *sockaddr) error { return k.id.Bind(raw(sa)) }
func (k kid) resolveAddr(src, dst *sockaddr, timeout time.Duration) error {
	return k.id.ResolveAddr(raw(src), raw(dst), int(timeout/time.Millisecond))
}
func (k kid) join(sa *sockaddr, tok uint64) error { return k.id.Join(raw(sa), tok) }
func (k kid) joinEx(compMask, flags uint32, sa *sockaddr, tok uint64) error {
	return k.id.JoinEx(compMask, flags, raw(sa), tok)
}
func (k kid) leave(sa *sockaddr) error { return k.id.Leave(raw(sa)) }
func (k kid) setOption(level, name int, val []byte) error {
	return k.id.SetOption(level, name, val)
}
func (k kid) resolveRoute(timeout time.Duration) error {
	return k.id.ResolveRoute(int(timeout / time.Millisecond))
}
func (k kid) srcPort() uint16 { return k.id.SrcPort() }
func (k kid) dstPort() uint16 { return k.id.DstPort() }
func (k kid) initQPAttr() (verbs.QPAttr, verbs.QPAttrMask, error) {
	return k.id.InitQPAttr(verbs.QPSInit)
}
func (k kid) local() sockaddr    { return fromRaw(k.id.LocalAddr()) }
func (k kid) peer() sockaddr     { return fromRaw(k.id.PeerAddr()) }
func (k kid) deviceName() string { return k.id.DeviceName() }
func (k kid) portNum() uint8     { return k.id.PortNum() }
func (k kid) destroy() error     { return k.id.Destroy() }

// interfaceIndex is the scope id of an IPv6 zone (a name or a number).
func interfaceIndex(zone string) (int, error) {
	if ifi, err := net.InterfaceByName(zone); err == nil {
		return ifi.Index, nil
	}
	return strconv.Atoi(zone)
}

// interfaceName is the zone of an IPv6 scope id.
func interfaceName(index int) (string, error) {
	ifi, err := net.InterfaceByIndex(index)
	if err != nil {
		return "", err
	}
	return ifi.Name, nil
}
