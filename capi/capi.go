//go:build capi

package main

/*
// The package's preambles include <capi.h>, found by -I${SRCDIR}, not
// "capi.h": cgo preprocesses each preamble from a file in TMPDIR, where a
// quoted include looks first, and where a c-shared build of this package
// (go build -buildmode=c-shared -o /tmp/capi.so) leaves its own capi.h.
#cgo CFLAGS: -O2 -Wall -I${SRCDIR}
#include <stdlib.h>
#include <string.h>
#include <capi.h>
*/
import "C"

import (
	"errors"
	"net"
	"sync"
	"syscall"
	"unsafe"

	_ "github.com/softrdma/softrdma/provider/all" // softrdma's devices
	"github.com/softrdma/softrdma/rdmacm"
	"github.com/softrdma/softrdma/verbs"
)

// registry maps the handles stored in C structs to Go objects. A handle
// is never reused, so a freed object's handle finds nothing (EINVAL), not
// another object.
type registry struct {
	mu   sync.Mutex // guards next and the maps below (objs is a sync.Map: lookups on the data path take no lock)
	next uintptr
	objs sync.Map // uintptr → object

	devs map[*verbs.Device]*C.struct_sr_device
	ctxs map[*verbs.Context]*C.struct_sr_context
	cqs  map[*verbs.CQ]*C.struct_sr_cq
	pds  map[*verbs.PD]*C.struct_sr_pd
}

var reg = registry{
	devs: map[*verbs.Device]*C.struct_sr_device{},
	ctxs: map[*verbs.Context]*C.struct_sr_context{},
	cqs:  map[*verbs.CQ]*C.struct_sr_cq{},
	pds:  map[*verbs.PD]*C.struct_sr_pd{},
}

func (r *registry) put(v any) C.uintptr_t {
	r.mu.Lock()
	r.next++
	h := r.next
	r.mu.Unlock()
	r.objs.Store(h, v)
	return C.uintptr_t(h)
}

func (r *registry) del(h C.uintptr_t) { r.objs.Delete(uintptr(h)) }

// get returns the object of handle h if it has type T.
func get[T any](h C.uintptr_t) (T, bool) {
	v, _ := reg.objs.Load(uintptr(h))
	t, ok := v.(T)
	return t, ok
}

// errno is the errno of a Go error (0 for nil, EIO when it carries none).
func errno(err error) C.int {
	if err == nil {
		return 0
	}
	var e syscall.Errno
	if errors.As(err, &e) {
		return C.int(e)
	}
	if e := verbs.ErrnoOf(err); e != 0 {
		return C.int(e)
	}
	return C.int(syscall.EIO)
}

// htons and friends: the byte order of the C structs' __be fields.
func htons(v uint16) uint16 { return v<<8 | v>>8 }
func htonl(v uint32) uint32 {
	return v<<24 | (v<<8)&0xff0000 | (v>>8)&0xff00 | v>>24
}
func htonll(v uint64) uint64 { return uint64(htonl(uint32(v)))<<32 | uint64(htonl(uint32(v>>32))) }

// goAddr converts a C socket address: AF_INET, AF_INET6 or AF_IB.
func goAddr(sa *C.struct_sockaddr) (net.Addr, error) {
	if sa == nil {
		return nil, nil
	}
	switch sa.sa_family {
	case C.AF_INET:
		sin := (*C.struct_sockaddr_in)(unsafe.Pointer(sa))
		ip := C.GoBytes(unsafe.Pointer(&sin.sin_addr), 4)
		return &net.UDPAddr{IP: net.IP(ip), Port: int(htons(uint16(sin.sin_port)))}, nil
	case C.AF_INET6:
		sin6 := (*C.struct_sockaddr_in6)(unsafe.Pointer(sa))
		ip := C.GoBytes(unsafe.Pointer(&sin6.sin6_addr), 16)
		a := &net.UDPAddr{IP: net.IP(ip), Port: int(htons(uint16(sin6.sin6_port)))}
		if sin6.sin6_scope_id != 0 {
			if ifi, err := net.InterfaceByIndex(int(sin6.sin6_scope_id)); err == nil {
				a.Zone = ifi.Name
			}
		}
		return a, nil
	case C.AF_IB:
		sib := (*C.struct_sockaddr_ib)(unsafe.Pointer(sa))
		a := &rdmacm.IBAddr{}
		copy(a.GID[:], C.GoBytes(unsafe.Pointer(&sib.sib_addr), 16))
		a.PKey = htons(uint16(sib.sib_pkey))
		a.FlowInfo = htonl(uint32(sib.sib_flowinfo))
		a.SID = htonll(uint64(sib.sib_sid))
		a.SIDMask = htonll(uint64(sib.sib_sid_mask))
		a.ScopeID = uint64(sib.sib_scope_id)
		return a, nil
	}
	// librdmacm's ucma_addrlen knows no other family, and every call
	// refuses an address it gives no length with EINVAL.
	return nil, syscall.EINVAL
}

// putAddr writes a into the C socket address sa (room for a
// sockaddr_storage); nil or an unknown kind clears it.
func putAddr(sa *C.struct_sockaddr, a net.Addr) C.socklen_t {
	C.memset(unsafe.Pointer(sa), 0, C.sizeof_struct_sockaddr_storage)
	var ip net.IP
	var port int
	var zone string
	switch v := a.(type) {
	case *net.UDPAddr:
		if v == nil {
			return 0
		}
		ip, port, zone = v.IP, v.Port, v.Zone
	case *net.TCPAddr:
		if v == nil {
			return 0
		}
		ip, port, zone = v.IP, v.Port, v.Zone
	case *net.IPAddr:
		if v == nil {
			return 0
		}
		ip, zone = v.IP, v.Zone
	case *rdmacm.IBAddr:
		if v == nil {
			return 0
		}
		sib := (*C.struct_sockaddr_ib)(unsafe.Pointer(sa))
		sib.sib_family = C.AF_IB
		copy(unsafe.Slice((*byte)(unsafe.Pointer(&sib.sib_addr)), 16), v.GID[:])
		sib.sib_pkey = C.__be16(htons(v.PKey))
		sib.sib_flowinfo = C.__be32(htonl(v.FlowInfo))
		sib.sib_sid = C.__be64(htonll(v.SID))
		sib.sib_sid_mask = C.__be64(htonll(v.SIDMask))
		sib.sib_scope_id = C.__u64(v.ScopeID)
		return C.sizeof_struct_sockaddr_ib
	default:
		return 0
	}
	if ip4 := ip.To4(); ip4 != nil {
		sin := (*C.struct_sockaddr_in)(unsafe.Pointer(sa))
		sin.sin_family = C.AF_INET
		sin.sin_port = C.in_port_t(htons(uint16(port)))
		copy(unsafe.Slice((*byte)(unsafe.Pointer(&sin.sin_addr)), 4), ip4)
		return C.sizeof_struct_sockaddr_in
	}
	if len(ip) != net.IPv6len {
		return 0
	}
	sin6 := (*C.struct_sockaddr_in6)(unsafe.Pointer(sa))
	sin6.sin6_family = C.AF_INET6
	sin6.sin6_port = C.in_port_t(htons(uint16(port)))
	copy(unsafe.Slice((*byte)(unsafe.Pointer(&sin6.sin6_addr)), 16), ip)
	if zone != "" {
		if ifi, err := net.InterfaceByName(zone); err == nil {
			sin6.sin6_scope_id = C.uint32_t(ifi.Index)
		}
	}
	return C.sizeof_struct_sockaddr_in6
}
