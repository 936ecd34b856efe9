//go:build rdmacore && cgo

package rdmacore

// #include "shim.h"
import "C"

import (
	"runtime"
	"sync"
	"syscall"
	"unsafe"

	"github.com/softrdma/softrdma/verbs"
	"github.com/softrdma/softrdma/verbs/driver"
)

// pd is a protection domain (struct ibv_pd): driver.PDOps. The kernel
// refuses to free a PD that MRs, QPs or AHs use (EBUSY).
type pd struct {
	ctx *kctx
	c   *C.struct_ibv_pd

	mu   sync.RWMutex // dead (write); calls on c (read)
	dead bool
	gone *freed
}

// live read-locks the PD for a call on its C object and returns it, or
// EINVAL (as op) once deallocated; the caller runs p.mu.RUnlock.
func (p *pd) live(op string) (*C.struct_ibv_pd, error) {
	p.mu.RLock()
	if p.dead {
		return nil, verbs.Errorf(op, "", syscall.EINVAL)
	}
	return p.c, nil
}

// RegMR registers buf (ibv_reg_mr). The Go memory stays pinned
// (runtime.Pinner) until Dereg, as the cgo pointer rules require for
// memory that C code (here: the kernel and the provider library) keeps
// using after the call.
func (p *pd) RegMR(buf []byte, access verbs.Access) (driver.MROps, error) {
	c, err := p.live("ibv_reg_mr")
	defer p.mu.RUnlock()
	if err != nil {
		return nil, err
	}
	m := &mr{pd: p}
	ptr := unsafe.Pointer(unsafe.SliceData(buf))
	if len(buf) > 0 {
		m.pin.Pin(ptr)
	}
	mc, cerrno := C.sr_reg_mr(c, ptr, C.size_t(len(buf)), C.int(access))
	if mc == nil {
		m.pin.Unpin()
		return nil, verbs.Errorf("ibv_reg_mr", "", cerr(cerrno))
	}
	m.c = mc
	m.lkey, m.rkey = uint32(mc.lkey), uint32(mc.rkey)
	m.gone = watch(m, "memory region (ibv_mr)")
	return m, nil
}

// CreateAH creates an address handle (ibv_create_ah); the kernel resolves
// a RoCE destination's MAC address.
func (p *pd) CreateAH(attr *verbs.AHAttr) (driver.AHOps, error) {
	c, err := p.live("ibv_create_ah")
	defer p.mu.RUnlock()
	if err != nil {
		return nil, err
	}
	var a C.struct_ibv_ah_attr
	*(*verbs.GID)(unsafe.Pointer(&a.grh.dgid)) = attr.GRH.DGID
	a.grh.flow_label = C.uint32_t(attr.GRH.FlowLabel)
	a.grh.sgid_index = C.uint8_t(attr.GRH.SGIDIndex)
	a.grh.hop_limit = C.uint8_t(attr.GRH.HopLimit)
	a.grh.traffic_class = C.uint8_t(attr.GRH.TrafficClass)
	a.dlid = C.uint16_t(attr.DLID)
	a.sl = C.uint8_t(attr.SL)
	a.src_path_bits = C.uint8_t(attr.SrcPathBits)
	a.static_rate = C.uint8_t(attr.StaticRate)
	if attr.IsGlobal {
		a.is_global = 1
	}
	a.port_num = C.uint8_t(attr.PortNum)
	ac, cerrno := C.ibv_create_ah(c, &a)
	if ac == nil {
		return nil, verbs.Errorf("ibv_create_ah", "", cerr(cerrno))
	}
	h := &ah{pd: p, c: ac}
	h.gone = watch(h, "address handle (ibv_ah)")
	return h, nil
}

// Dealloc frees the PD (ibv_dealloc_pd); the kernel's EBUSY while MRs, QPs
// or AHs of it exist, EINVAL when freed already.
func (p *pd) Dealloc() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.dead {
		return verbs.Errorf("ibv_dealloc_pd", "", syscall.EINVAL)
	}
	if rc := C.ibv_dealloc_pd(p.c); rc != 0 {
		return verbs.Errorf("ibv_dealloc_pd", "", ibvErrno(int(rc)))
	}
	p.dead = true
	p.gone.set()
	_ = p.ctx.use(-1, 0)
	return nil
}

// mr is a registered memory region (struct ibv_mr): driver.MROps.
type mr struct {
	pd  *pd
	c   *C.struct_ibv_mr
	pin runtime.Pinner
	// The keys, copied out: the C object is freed by Dereg.
	lkey, rkey uint32

	mu   sync.Mutex
	dead bool
	gone *freed
}

// LKey returns the local key.
func (m *mr) LKey() uint32 { return m.lkey }

// RKey returns the remote key.
func (m *mr) RKey() uint32 { return m.rkey }

// Dereg deregisters the region (ibv_dereg_mr) and unpins its memory.
func (m *mr) Dereg() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.dead {
		return verbs.Errorf("ibv_dereg_mr", "", syscall.EINVAL)
	}
	if rc := C.ibv_dereg_mr(m.c); rc != 0 {
		return verbs.Errorf("ibv_dereg_mr", "", ibvErrno(int(rc)))
	}
	m.dead = true
	m.gone.set()
	m.pin.Unpin()
	return nil
}

// ah is an address handle (struct ibv_ah): driver.AHOps. A post that
// uses it holds life for reading until libibverbs has taken the request,
// so Destroy never frees it under a post.
type ah struct {
	pd   *pd
	c    *C.struct_ibv_ah
	life sync.RWMutex // dead (write); posts that use c (read)
	dead bool
	gone *freed
}

// Destroy destroys the address handle (ibv_destroy_ah), after the posts
// that use it.
func (a *ah) Destroy() error {
	a.life.Lock()
	defer a.life.Unlock()
	if a.dead {
		return verbs.Errorf("ibv_destroy_ah", "", syscall.EINVAL)
	}
	if rc := C.ibv_destroy_ah(a.c); rc != 0 {
		return verbs.Errorf("ibv_destroy_ah", "", ibvErrno(int(rc)))
	}
	a.dead = true
	a.gone.set()
	return nil
}
