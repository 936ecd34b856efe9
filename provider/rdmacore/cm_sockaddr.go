//go:build rdmacore && cgo

package rdmacore

import (
	"encoding/binary"
	"net/netip"
	"syscall"
)

// Sockaddr is a socket address as librdmacm takes it: AF_INET
// (struct sockaddr_in), AF_INET6 (sockaddr_in6) or AF_IB (sockaddr_ib).
type Sockaddr struct {
	Family int
	// IP, Port and Scope are the address of AF_INET and AF_INET6.
	IP    netip.Addr
	Port  uint16
	Scope uint32
	// The AF_IB fields (struct sockaddr_ib).
	PKey     uint16
	FlowInfo uint32
	GID      [16]byte
	SID      uint64
	SIDMask  uint64
	IBScope  uint64
}

// AFIB is AF_IB, the InfiniBand address family.
const AFIB = 27

// Socket address sizes of the C structs (checked against C in the tests).
const (
	sizeofSockaddrIn  = 16
	sizeofSockaddrIn6 = 28
	sizeofSockaddrIB  = 48
)

// Marshal returns the C bytes of the address; nil for an unknown family.
func (s Sockaddr) Marshal() []byte {
	switch s.Family {
	case syscall.AF_INET:
		b := make([]byte, sizeofSockaddrIn)
		binary.NativeEndian.PutUint16(b[0:], syscall.AF_INET)
		binary.BigEndian.PutUint16(b[2:], s.Port)
		a := s.IP.Unmap().As4()
		copy(b[4:8], a[:])
		return b
	case syscall.AF_INET6:
		b := make([]byte, sizeofSockaddrIn6)
		binary.NativeEndian.PutUint16(b[0:], syscall.AF_INET6)
		binary.BigEndian.PutUint16(b[2:], s.Port)
		a := s.IP.As16()
		copy(b[8:24], a[:])
		binary.NativeEndian.PutUint32(b[24:], s.Scope)
		return b
	case AFIB:
		b := make([]byte, sizeofSockaddrIB)
		binary.NativeEndian.PutUint16(b[0:], AFIB)
		binary.BigEndian.PutUint16(b[2:], s.PKey)
		binary.BigEndian.PutUint32(b[4:], s.FlowInfo)
		copy(b[8:24], s.GID[:])
		binary.BigEndian.PutUint64(b[24:], s.SID)
		binary.BigEndian.PutUint64(b[32:], s.SIDMask)
		binary.NativeEndian.PutUint64(b[40:], s.IBScope)
		return b
	}
	return nil
}

// ParseSockaddr decodes the C bytes of a socket address; ok is false for
// an unknown family or short bytes.
func ParseSockaddr(b []byte) (s Sockaddr, ok bool) {
	if len(b) < 2 {
		return s, false
	}
	s.Family = int(binary.NativeEndian.Uint16(b))
	switch {
	case s.Family == syscall.AF_INET && len(b) >= sizeofSockaddrIn:
		s.Port = binary.BigEndian.Uint16(b[2:])
		s.IP = netip.AddrFrom4([4]byte(b[4:8]))
	case s.Family == syscall.AF_INET6 && len(b) >= sizeofSockaddrIn6:
		s.Port = binary.BigEndian.Uint16(b[2:])
		s.IP = netip.AddrFrom16([16]byte(b[8:24]))
		s.Scope = binary.NativeEndian.Uint32(b[24:])
	case s.Family == AFIB && len(b) >= sizeofSockaddrIB:
		s.PKey = binary.BigEndian.Uint16(b[2:])
		s.FlowInfo = binary.BigEndian.Uint32(b[4:])
		copy(s.GID[:], b[8:24])
		s.SID = binary.BigEndian.Uint64(b[24:])
		s.SIDMask = binary.BigEndian.Uint64(b[32:])
		s.IBScope = binary.NativeEndian.Uint64(b[40:])
	default:
		return Sockaddr{}, false
	}
	return s, true
}
