//go:build rdmacore && cgo

package cm

import (
	"net/netip"
	"syscall"
	"time"

	"github.com/softrdma/softrdma/rdmacm/kernelcm"
	"github.com/softrdma/softrdma/verbs"
)

// The kernel's CM as an rdmacm engine: the channel and id types of this
// package behind engine's interfaces, registered at init.

func init() { kernelcm.Register("rdmacore", stack{}) }

type stack struct{}

func (stack) NewChannel() (kernelcm.Channel, error) {
	c, err := NewCMChannel()
	if err != nil {
		return nil, err
	}
	return channel{c}, nil
}

type channel struct{ c *CMChannel }

func (k channel) CreateID(tok uint64, ps uint16) (kernelcm.ID, error) {
	id, err := k.c.CreateID(tok, ps)
	if err != nil {
		return nil, err
	}
	return cmID{id}, nil
}

func (k channel) OwnerOf(a netip.Addr) string {
	fam := syscall.AF_INET6
	if a.Is4() {
		fam = syscall.AF_INET
	}
	return k.c.OwnerOf(marshal(&kernelcm.Sockaddr{Family: fam, IP: a}))
}

func (k channel) Next() (*kernelcm.Event, error) {
	ev, err := k.c.Next()
	if err != nil {
		return nil, err
	}
	return &kernelcm.Event{
		Type: ev.Type, Status: ev.Status, IDToken: ev.IDToken, MCToken: ev.MCToken,
		QPNum: ev.QPNum, QKey: ev.QKey, AHAttr: ev.AHAttr, PrivateDataLen: ev.PrivateDataLen, Ack: ev.Ack,
	}, nil
}

func (k channel) Close() error { return k.c.Close() }

type cmID struct{ id *CMID }

func (k cmID) Bind(sa *kernelcm.Sockaddr) error { return k.id.Bind(marshal(sa)) }
func (k cmID) ResolveAddr(src, dst *kernelcm.Sockaddr, timeout time.Duration) error {
	return k.id.ResolveAddr(marshal(src), marshal(dst), int(timeout/time.Millisecond))
}
func (k cmID) Join(sa *kernelcm.Sockaddr, tok uint64) error { return k.id.Join(marshal(sa), tok) }
func (k cmID) JoinEx(compMask, flags uint32, sa *kernelcm.Sockaddr, tok uint64) error {
	return k.id.JoinEx(compMask, flags, marshal(sa), tok)
}
func (k cmID) Leave(sa *kernelcm.Sockaddr) error { return k.id.Leave(marshal(sa)) }
func (k cmID) SetOption(level, name int, val []byte) error {
	return k.id.SetOption(level, name, val)
}
func (k cmID) ResolveRoute(timeout time.Duration) error {
	return k.id.ResolveRoute(int(timeout / time.Millisecond))
}
func (k cmID) SrcPort() uint16 { return k.id.SrcPort() }
func (k cmID) DstPort() uint16 { return k.id.DstPort() }
func (k cmID) InitQPAttr() (verbs.QPAttr, verbs.QPAttrMask, error) {
	return k.id.InitQPAttr(verbs.QPSInit)
}
func (k cmID) Local() kernelcm.Sockaddr     { return parse(k.id.LocalAddr()) }
func (k cmID) Peer() kernelcm.Sockaddr      { return parse(k.id.PeerAddr()) }
func (k cmID) DeviceName() string           { return k.id.DeviceName() }
func (k cmID) Route() []kernelcm.PathRecord { return k.id.Route() }
func (k cmID) PortNum() uint8               { return k.id.PortNum() }
func (k cmID) Destroy() error               { return k.id.Destroy() }
