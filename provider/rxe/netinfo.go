package rxe

import (
	"fmt"
	"net"
	"net/netip"
	"syscall"

	"github.com/softrdma/softrdma/verbs"
	"github.com/softrdma/softrdma/wire"
)

// rxeMaxHdrLen is what rxe subtracts from the netdev MTU before rounding
// down to an IB MTU (RXE_MAX_HDR_LENGTH).
const rxeMaxHdrLen = 80

// gidTableLen is the GID table size rxe reports (RXE_PORT_GID_TBL_LEN).
const gidTableLen = 1024

// ifInfo is an immutable snapshot of the interface below a device.
type ifInfo struct {
	name  string
	up    bool
	mtu   int
	mac   net.HardwareAddr
	gids  []verbs.GIDEntry
	addrs []netip.Addr // every address of the interface, IPv4 first
}

// activeMTU is rxe's mtu_cap: the largest IB MTU not larger than the
// netdev MTU minus 80 bytes, at least 256.
func (i *ifInfo) activeMTU() verbs.MTU {
	m := verbs.MTUFromBytes(i.mtu - rxeMaxHdrLen)
	if m == 0 {
		m = verbs.MTU256
	}
	return m
}

// gid returns the GID table entry at index.
func (i *ifInfo) gid(index int) (verbs.GIDEntry, bool) {
	if index < 0 || index >= len(i.gids) {
		return verbs.GIDEntry{}, false
	}
	return i.gids[index], true
}

// hasAddr reports whether a is an address of the interface.
func (i *ifInfo) hasAddr(a netip.Addr) bool {
	for _, x := range i.addrs {
		if x == a {
			return true
		}
	}
	return false
}

// firstIPv4 returns the interface's first IPv4 address, if any.
func (i *ifInfo) firstIPv4() (netip.Addr, bool) {
	if len(i.addrs) > 0 && i.addrs[0].Is4() {
		return i.addrs[0], true
	}
	return netip.Addr{}, false
}

// loadIfInfo reads the state, MTU and addresses of interface ifindex.
func loadIfInfo(ifindex int) (*ifInfo, error) {
	ifi, err := net.InterfaceByIndex(ifindex)
	if err != nil {
		return nil, fmt.Errorf("rxe: interface %d: %v: %w", ifindex, err, syscall.ENODEV)
	}
	as, err := ifi.Addrs()
	if err != nil {
		return nil, fmt.Errorf("rxe: addresses of %s: %w", ifi.Name, err)
	}
	var v4, v6 []netip.Addr
	for _, a := range as {
		ipn, ok := a.(*net.IPNet)
		if !ok {
			continue
		}
		ip, ok := netip.AddrFromSlice(ipn.IP)
		if !ok {
			continue
		}
		ip = ip.Unmap()
		if ip.Is4() {
			v4 = append(v4, ip)
		} else {
			v6 = append(v6, ip)
		}
	}
	info := &ifInfo{
		name:  ifi.Name,
		up:    ifi.Flags&net.FlagUp != 0 && ifi.Flags&net.FlagRunning != 0,
		mtu:   ifi.MTU,
		mac:   ifi.HardwareAddr,
		addrs: append(v4, v6...),
	}
	for i, a := range info.addrs {
		info.gids = append(info.gids, verbs.GIDEntry{
			GID:       wire.GIDFromAddr(a),
			Index:     i,
			PortNum:   1,
			Type:      verbs.GIDTypeRoCEv2,
			NetdevIdx: ifindex,
		})
	}
	return info, nil
}

// nodeGUID derives a node GUID like rxe (addrconf_addr_eui48 of the MAC:
// EUI-64 with the universal/local bit flipped); an interface without a
// MAC (or an all-zero one, like lo) gets a locally administered GUID made
// from its index.
func nodeGUID(mac net.HardwareAddr, ifindex int) uint64 {
	if len(mac) == 6 && (mac[0]|mac[1]|mac[2]|mac[3]|mac[4]|mac[5]) != 0 {
		b := [8]byte{mac[0] ^ 2, mac[1], mac[2], 0xff, 0xfe, mac[3], mac[4], mac[5]}
		var g uint64
		for _, x := range b {
			g = g<<8 | uint64(x)
		}
		return g
	}
	return 0x020000fffe000000 | uint64(ifindex)&0xffffff
}
