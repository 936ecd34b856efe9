package softverbs

import (
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"
	"unsafe"

	"github.com/softrdma/softrdma/verbs"
	"github.com/softrdma/softrdma/verbs/driver"
)

// pdObj is a protection domain (struct ibv_pd).
type pdObj struct {
	ctx *ctxObj

	mu     sync.Mutex
	mrs    map[uint32]*mrObj // by lkey; copied on write into mrView
	mrView atomic.Pointer[map[uint32]*mrObj]
	qps    int
	ahs    int
	dead   bool
}

// AllocPD allocates a protection domain (ibv_alloc_pd).
func (c *ctxObj) AllocPD() (driver.PDOps, error) {
	if err := c.dev.take(objPD); err != nil {
		return nil, err
	}
	if err := c.use(1, 0); err != nil {
		c.dev.put(objPD)
		return nil, err
	}
	pd := &pdObj{ctx: c, mrs: map[uint32]*mrObj{}}
	pd.mrView.Store(&map[uint32]*mrObj{})
	return pd, nil
}

// Context returns the device context of the PD.
func (pd *pdObj) Context() *ctxObj { return pd.ctx }

// Dealloc frees the PD (ibv_dealloc_pd). It fails with EBUSY while memory
// regions, QPs or address handles of the PD exist.
func (pd *pdObj) Dealloc() error {
	pd.mu.Lock()
	defer pd.mu.Unlock()
	if pd.dead {
		return syscall.EINVAL
	}
	if len(pd.mrs) > 0 || pd.qps > 0 || pd.ahs > 0 {
		return syscall.EBUSY
	}
	pd.dead = true
	pd.ctx.release(1, 0)
	pd.ctx.dev.put(objPD)
	return nil
}

func (pd *pdObj) hold(qp, ah int) error {
	pd.mu.Lock()
	defer pd.mu.Unlock()
	if pd.dead {
		return syscall.EINVAL
	}
	pd.qps += qp
	pd.ahs += ah
	return nil
}

// mrObj is a registered memory region (struct ibv_mr) over a Go byte slice.
// The slice must not be resized or reused for other purposes while it is
// registered; verbs keeps a reference, so it stays at the same address.
type mrObj struct {
	pd     *pdObj
	buf    []byte
	addr   uint64
	lkey   uint32
	access verbs.Access
}

// RegMR registers buf (ibv_reg_mr). Receives need AccessLocalWrite.
func (pd *pdObj) RegMR(buf []byte, access verbs.Access) (driver.MROps, error) {
	if len(buf) == 0 {
		return nil, fmt.Errorf("empty buffer: %w", syscall.EINVAL)
	}
	if access&(verbs.AccessRemoteWrite|verbs.AccessRemoteAtomic) != 0 && access&verbs.AccessLocalWrite == 0 {
		return nil, fmt.Errorf("remote write needs local write: %w", syscall.EINVAL)
	}
	mr := &mrObj{
		pd:     pd,
		buf:    buf,
		addr:   uint64(uintptr(unsafe.Pointer(unsafe.SliceData(buf)))),
		lkey:   pd.ctx.dev.nextKey.Add(1)<<8 | 0x5a,
		access: access,
	}
	if err := pd.ctx.dev.take(objMR); err != nil {
		return nil, err
	}
	pd.mu.Lock()
	defer pd.mu.Unlock()
	if pd.dead {
		pd.ctx.dev.put(objMR)
		return nil, syscall.EINVAL
	}
	pd.mrs[mr.lkey] = mr
	pd.publishMRs()
	return mr, nil
}

func (pd *pdObj) publishMRs() {
	m := make(map[uint32]*mrObj, len(pd.mrs))
	for k, v := range pd.mrs {
		m[k] = v
	}
	pd.mrView.Store(&m)
}

// Dereg deregisters the region (ibv_dereg_mr). Receive WRs already posted
// on it keep their reference; do not dereg memory a QP may still write.
func (mr *mrObj) Dereg() error {
	pd := mr.pd
	pd.mu.Lock()
	defer pd.mu.Unlock()
	if pd.mrs[mr.lkey] != mr {
		return syscall.EINVAL
	}
	delete(pd.mrs, mr.lkey)
	pd.publishMRs()
	pd.ctx.dev.put(objMR)
	return nil
}

// LKey returns the local key.
func (mr *mrObj) LKey() uint32 { return mr.lkey }

// RKey returns the remote key (equal to the local key here).
func (mr *mrObj) RKey() uint32 { return mr.lkey }

// Addr returns the address of the first registered byte, for SGEs.
func (mr *mrObj) Addr() uint64 { return mr.addr }

// Len returns the length of the region.
func (mr *mrObj) Len() int { return len(mr.buf) }

// Buf returns the registered slice.
func (mr *mrObj) Buf() []byte { return mr.buf }

// SGE returns a scatter/gather element for length bytes at offset off.
func (mr *mrObj) SGE(off, length int) verbs.SGE {
	return verbs.SGE{Addr: mr.addr + uint64(off), Length: uint32(length), LKey: mr.lkey}
}

// seg is an SGE resolved to registered memory.
type seg struct {
	mr  *mrObj
	off int
	n   int
}

// resolve checks an SGE against the PD's regions.
func (pd *pdObj) resolve(s verbs.SGE, write bool) (seg, error) {
	mr := (*pd.mrView.Load())[s.LKey]
	if mr == nil {
		return seg{}, fmt.Errorf("sge lkey %#x: %w", s.LKey, syscall.EINVAL)
	}
	if write && mr.access&verbs.AccessLocalWrite == 0 {
		return seg{}, fmt.Errorf("sge lkey %#x lacks local write: %w", s.LKey, syscall.EACCES)
	}
	if s.Addr < mr.addr || s.Addr+uint64(s.Length) > mr.addr+uint64(len(mr.buf)) || s.Addr+uint64(s.Length) < s.Addr {
		return seg{}, fmt.Errorf("sge [%#x,+%d) outside mr: %w", s.Addr, s.Length, syscall.EINVAL)
	}
	return seg{mr: mr, off: int(s.Addr - mr.addr), n: int(s.Length)}, nil
}
