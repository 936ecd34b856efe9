//go:build rdmacore && cgo

package cm

/*
#include <netinet/in.h>
#include <infiniband/ib.h>
*/
import "C"

import (
	"encoding/binary"
	"net/netip"
	"syscall"

	"github.com/softrdma/softrdma/rdmacm/kernelcm"
)

// The C structs' sizes, from the distribution's headers.
const (
	sizeofSockaddrIn  = C.sizeof_struct_sockaddr_in
	sizeofSockaddrIn6 = C.sizeof_struct_sockaddr_in6
	sizeofSockaddrIB  = C.sizeof_struct_sockaddr_ib
)

// marshal returns the C bytes of a socket address (struct sockaddr_in,
// sockaddr_in6 or sockaddr_ib); nil for none or an unknown family.
func marshal(s *kernelcm.Sockaddr) []byte {
	if s == nil {
		return nil
	}
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
	case kernelcm.AFIB:
		b := make([]byte, sizeofSockaddrIB)
		binary.NativeEndian.PutUint16(b[0:], kernelcm.AFIB)
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

// parse decodes the C bytes of a socket address; the zero Sockaddr for
// an unknown family or short bytes.
func parse(b []byte) (s kernelcm.Sockaddr) {
	if len(b) < 2 {
		return s
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
	case s.Family == kernelcm.AFIB && len(b) >= sizeofSockaddrIB:
		s.PKey = binary.BigEndian.Uint16(b[2:])
		s.FlowInfo = binary.BigEndian.Uint32(b[4:])
		copy(s.GID[:], b[8:24])
		s.SID = binary.BigEndian.Uint64(b[24:])
		s.SIDMask = binary.BigEndian.Uint64(b[32:])
		s.IBScope = binary.NativeEndian.Uint64(b[40:])
	default:
		return kernelcm.Sockaddr{}
	}
	return s
}
