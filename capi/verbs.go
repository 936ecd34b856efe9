//go:build capi

package main

/*
#include <stdlib.h>
#include <string.h>
#include <capi.h>
*/
import "C"

import (
	"context"
	"errors"
	"sync/atomic"
	"syscall"
	"unsafe"

	"github.com/softrdma/softrdma/verbs"
)

// cDevice returns the C struct of a device, made on first use (rdma-core
// keeps its devices for the life of the process too).
func cDevice(d *verbs.Device) *C.struct_sr_device {
	reg.mu.Lock()
	cd := reg.devs[d]
	reg.mu.Unlock()
	if cd != nil {
		return cd
	}
	cd = (*C.struct_sr_device)(C.calloc(1, C.sizeof_struct_sr_device))
	cd.dev.node_type = C.IBV_NODE_CA
	cd.dev.transport_type = C.IBV_TRANSPORT_IB
	putStr(cd.dev.name[:], d.Name())
	putStr(cd.dev.dev_name[:], "softrdma_"+d.Name())
	putStr(cd.dev.dev_path[:], "/sys/class/infiniband_verbs/softrdma_"+d.Name())
	putStr(cd.dev.ibdev_path[:], "/sys/class/infiniband/"+d.Name())
	cd.h = reg.put(d)
	reg.mu.Lock()
	if old := reg.devs[d]; old != nil {
		reg.mu.Unlock()
		reg.del(cd.h)
		C.free(unsafe.Pointer(cd))
		return old
	}
	reg.devs[d] = cd
	reg.mu.Unlock()
	return cd
}

// putStr copies s into a C char array, NUL-terminated and truncated.
func putStr(dst []C.char, s string) {
	n := min(len(s), len(dst)-1)
	for i := 0; i < n; i++ {
		dst[i] = C.char(s[i])
	}
	dst[n] = 0
}

// cContext returns the C context of a Go context, made on first use.
func cContext(c *verbs.Context) *C.struct_ibv_context {
	if c == nil {
		return nil
	}
	reg.mu.Lock()
	cc := reg.ctxs[c]
	reg.mu.Unlock()
	if cc != nil {
		return &cc.vc.context
	}
	cc = C.sr_context_alloc(&cDevice(c.Device()).dev, C.int(c.NumCompVectors()))
	cc.h = reg.put(c)
	reg.mu.Lock()
	if old := reg.ctxs[c]; old != nil {
		reg.mu.Unlock()
		reg.del(cc.h)
		C.sr_context_free(cc)
		return &old.vc.context
	}
	reg.ctxs[c] = cc
	reg.mu.Unlock()
	startAsyncPump(c, cc)
	return &cc.vc.context
}

func goDevice(d *C.struct_ibv_device) (*verbs.Device, bool) {
	return get[*verbs.Device]((*C.struct_sr_device)(unsafe.Pointer(d)).h)
}

func goContext(c *C.struct_ibv_context) (*verbs.Context, bool) {
	return get[*verbs.Context](C.sr_ctx_of(c).h)
}

func goPD(pd *C.struct_ibv_pd) (*verbs.PD, bool) {
	if pd == nil {
		return nil, false
	}
	return get[*verbs.PD]((*C.struct_sr_pd)(unsafe.Pointer(pd)).h)
}

func goCQ(cq *C.struct_ibv_cq) (*verbs.CQ, bool) {
	if cq == nil {
		return nil, false
	}
	return get[*verbs.CQ]((*C.struct_sr_cq)(unsafe.Pointer(cq)).h)
}

func goAH(ah *C.struct_ibv_ah) (*verbs.AH, bool) {
	if ah == nil {
		return nil, false
	}
	return get[*verbs.AH]((*C.struct_sr_ah)(unsafe.Pointer(ah)).h)
}

//export srGetDeviceList
func srGetDeviceList(num *C.int, out ***C.struct_ibv_device) C.int {
	devs := verbs.DeviceList()
	list := (**C.struct_ibv_device)(C.calloc(C.size_t(len(devs)+1), C.size_t(unsafe.Sizeof(uintptr(0)))))
	if list == nil {
		return C.ENOMEM
	}
	s := unsafe.Slice(list, len(devs)+1)
	for i, d := range devs {
		s[i] = &cDevice(d).dev
	}
	*num, *out = C.int(len(devs)), list
	return 0
}

//export srDeviceGUID
func srDeviceGUID(d *C.struct_ibv_device) C.__be64 {
	gd, ok := goDevice(d)
	if !ok {
		return 0
	}
	return C.__be64(htonll(gd.GUID()))
}

//export srDeviceIndex
func srDeviceIndex(d *C.struct_ibv_device) C.int {
	gd, ok := goDevice(d)
	if !ok {
		return -1
	}
	for i, x := range verbs.DeviceList() {
		if x == gd {
			return C.int(i)
		}
	}
	return -1
}

//export srOpenDevice
func srOpenDevice(d *C.struct_ibv_device, out **C.struct_ibv_context) C.int {
	gd, ok := goDevice(d)
	if !ok {
		return C.ENODEV
	}
	c, err := gd.Open()
	if err != nil {
		return errno(err)
	}
	*out = cContext(c)
	return 0
}

//export srCloseDevice
func srCloseDevice(c *C.struct_ibv_context) C.int {
	gc, ok := goContext(c)
	if !ok {
		return C.EINVAL
	}
	err := gc.Close()
	if errors.Is(err, syscall.EBUSY) {
		// Objects left: closing the kernel's device file frees them
		// (ib_uverbs_cleanup_ufile), and ibv_close_device succeeds.
		releaseContext(gc)
		err = gc.Close()
	}
	if err != nil {
		return errno(err)
	}
	// Before sr_context_free closes async_fd: the pump writes it.
	stopAsyncPump(gc)
	cc := C.sr_ctx_of(c)
	reg.mu.Lock()
	delete(reg.ctxs, gc)
	reg.mu.Unlock()
	reg.del(cc.h)
	C.sr_context_free(cc)
	return 0
}

//export srQueryDevice
func srQueryDevice(c *C.struct_ibv_context, attr *C.struct_ibv_device_attr) C.int {
	gc, ok := goContext(c)
	if !ok {
		return C.EINVAL
	}
	a := gc.QueryDevice()
	putStr(attr.fw_ver[:], a.FWVer)
	attr.node_guid = C.__be64(htonll(a.NodeGUID))
	attr.sys_image_guid = C.__be64(htonll(a.SysImageGUID))
	attr.max_mr_size = ^C.uint64_t(0)
	attr.page_size_cap = 0xfffff000
	attr.vendor_id = C.uint32_t(a.VendorID)
	attr.vendor_part_id = C.uint32_t(a.VendorPartID)
	attr.hw_ver = C.uint32_t(a.HWVer)
	attr.max_qp = C.int(a.MaxQP)
	attr.max_qp_wr = C.int(a.MaxQPWR)
	attr.max_sge = C.int(a.MaxSGE)
	attr.max_cq = C.int(a.MaxCQ)
	attr.max_cqe = C.int(a.MaxCQE)
	attr.max_mr = C.int(a.MaxMR)
	attr.max_pd = C.int(a.MaxPD)
	attr.max_ah = C.int(a.MaxAH)
	attr.max_mcast_grp = C.int(a.MaxMcastGrp)
	attr.max_mcast_qp_attach = C.int(a.MaxMcastQPAttach)
	attr.max_total_mcast_qp_attach = C.int(a.MaxTotalMcastQP)
	attr.max_pkeys = 1
	attr.phys_port_cnt = C.uint8_t(a.PhysPortCnt)
	return 0
}

//export srQueryPort
func srQueryPort(c *C.struct_ibv_context, port C.uint8_t, attr *C.struct_ibv_port_attr) C.int {
	gc, ok := goContext(c)
	if !ok {
		return C.EINVAL
	}
	p, err := gc.QueryPort(uint8(port))
	if err != nil {
		return errno(err)
	}
	attr.state = uint32(p.State)
	attr.max_mtu = uint32(p.MaxMTU)
	attr.active_mtu = uint32(p.ActiveMTU)
	attr.gid_tbl_len = C.int(p.GIDTblLen)
	attr.port_cap_flags = C.IBV_PORT_CM_SUP
	if p.LinkLayer == verbs.LinkLayerEthernet {
		attr.port_cap_flags |= C.IBV_PORT_IP_BASED_GIDS
	}
	attr.max_msg_sz = 1 << 31
	attr.pkey_tbl_len = C.uint16_t(p.PKeyTblLen)
	attr.lid = C.uint16_t(p.LID)
	attr.sm_lid = C.uint16_t(p.SMLID)
	attr.lmc = C.uint8_t(p.LMC)
	attr.max_vl_num = 1
	attr.sm_sl = C.uint8_t(p.SMSL)
	attr.active_width = 1 // 1X
	attr.active_speed = 1 // SDR
	attr.phys_state = 3   // disabled
	if p.State == verbs.PortActive {
		attr.phys_state = 5 // link up
	}
	attr.link_layer = C.uint8_t(p.LinkLayer)
	return 0
}

//export srQueryGID
func srQueryGID(c *C.struct_ibv_context, port C.uint8_t, index C.int, gid *C.union_ibv_gid) C.int {
	gc, ok := goContext(c)
	if !ok {
		return C.EINVAL
	}
	g, err := gc.QueryGID(uint8(port), int(index))
	if err != nil {
		// An empty entry of the table reads as the zero GID, as in sysfs.
		p, perr := gc.QueryPort(uint8(port))
		if perr != nil || index < 0 || int(index) >= p.GIDTblLen {
			return errno(err)
		}
		g = verbs.GID{}
	}
	copy(unsafe.Slice((*byte)(unsafe.Pointer(gid)), 16), g[:])
	return 0
}

//export srQueryGIDType
func srQueryGIDType(c *C.struct_ibv_context, port C.uint8_t, index C.uint, typ *C.int) C.int {
	gc, ok := goContext(c)
	if !ok {
		return C.EINVAL
	}
	e, err := gc.QueryGIDEntry(uint8(port), int(index))
	if err != nil {
		return errno(err)
	}
	*typ = 0 // IBV_GID_TYPE_SYSFS_IB_ROCE_V1
	if e.Type == verbs.GIDTypeRoCEv2 {
		*typ = 1 // IBV_GID_TYPE_SYSFS_ROCE_V2
	}
	return 0
}

//export srQueryPKey
func srQueryPKey(c *C.struct_ibv_context, port C.uint8_t, index C.int, pkey *C.__be16) C.int {
	gc, ok := goContext(c)
	if !ok {
		return C.EINVAL
	}
	p, err := gc.QueryPort(uint8(port))
	if err != nil {
		return errno(err)
	}
	if index < 0 || int(index) >= max(p.PKeyTblLen, 1) {
		return C.EINVAL
	}
	*pkey = C.__be16(htons(0xffff)) // the default (full member) P_Key
	return 0
}

// cPD returns the C struct of a PD, made on first use.
func cPD(pd *verbs.PD) *C.struct_ibv_pd {
	if pd == nil {
		return nil
	}
	reg.mu.Lock()
	cp := reg.pds[pd]
	reg.mu.Unlock()
	if cp != nil {
		return &cp.pd
	}
	cp = (*C.struct_sr_pd)(C.calloc(1, C.sizeof_struct_sr_pd))
	cp.pd.context = cContext(pd.Context())
	cp.h = reg.put(pd)
	cp.pd.handle = C.uint32_t(cp.h)
	reg.mu.Lock()
	reg.pds[pd] = cp
	reg.mu.Unlock()
	return &cp.pd
}

//export srAllocPD
func srAllocPD(c *C.struct_ibv_context, out **C.struct_ibv_pd) C.int {
	gc, ok := goContext(c)
	if !ok {
		return C.EINVAL
	}
	pd, err := gc.AllocPD()
	if err != nil {
		return errno(err)
	}
	*out = cPD(pd)
	return 0
}

//export srDeallocPD
func srDeallocPD(pd *C.struct_ibv_pd) C.int {
	gp, ok := goPD(pd)
	if !ok {
		return C.EINVAL
	}
	if err := gp.Dealloc(); err != nil {
		return errno(err)
	}
	cp := (*C.struct_sr_pd)(unsafe.Pointer(pd))
	reg.mu.Lock()
	delete(reg.pds, gp)
	reg.mu.Unlock()
	reg.del(cp.h)
	C.free(unsafe.Pointer(cp))
	return 0
}

//export srRegMR
func srRegMR(pd *C.struct_ibv_pd, addr unsafe.Pointer, length C.size_t, access C.int, out **C.struct_ibv_mr) C.int {
	gp, ok := goPD(pd)
	if !ok {
		return C.EINVAL
	}
	if addr == nil && length != 0 {
		return C.EINVAL
	}
	var buf []byte
	if length != 0 {
		buf = unsafe.Slice((*byte)(addr), int(length))
	}
	mr, err := gp.RegMR(buf, verbs.Access(access))
	if err != nil {
		return errno(err)
	}
	cm := (*C.struct_sr_mr)(C.calloc(1, C.sizeof_struct_sr_mr))
	cm.mr.context = pd.context
	cm.mr.pd = pd
	cm.mr.addr = addr
	cm.mr.length = length
	cm.mr.lkey = C.uint32_t(mr.LKey())
	cm.mr.rkey = C.uint32_t(mr.RKey())
	cm.h = reg.put(mr)
	cm.mr.handle = C.uint32_t(cm.h)
	*out = &cm.mr
	return 0
}

//export srDeregMR
func srDeregMR(mr *C.struct_ibv_mr) C.int {
	cm := (*C.struct_sr_mr)(unsafe.Pointer(mr))
	gm, ok := get[*verbs.MR](cm.h)
	if !ok {
		return C.EINVAL
	}
	if err := gm.Dereg(); err != nil {
		return errno(err)
	}
	reg.del(cm.h)
	C.free(unsafe.Pointer(cm))
	return 0
}

// goAHAttr converts struct ibv_ah_attr.
func goAHAttr(a *C.struct_ibv_ah_attr) verbs.AHAttr {
	var g verbs.AHAttr
	copy(g.GRH.DGID[:], unsafe.Slice((*byte)(unsafe.Pointer(&a.grh.dgid)), 16))
	g.GRH.FlowLabel = uint32(a.grh.flow_label)
	g.GRH.SGIDIndex = uint8(a.grh.sgid_index)
	g.GRH.HopLimit = uint8(a.grh.hop_limit)
	g.GRH.TrafficClass = uint8(a.grh.traffic_class)
	g.DLID = uint16(a.dlid)
	g.SL = uint8(a.sl)
	g.SrcPathBits = uint8(a.src_path_bits)
	g.StaticRate = uint8(a.static_rate)
	g.IsGlobal = a.is_global != 0
	g.PortNum = uint8(a.port_num)
	return g
}

// putAHAttr writes struct ibv_ah_attr.
func putAHAttr(a *C.struct_ibv_ah_attr, g *verbs.AHAttr) {
	C.memset(unsafe.Pointer(a), 0, C.sizeof_struct_ibv_ah_attr)
	copy(unsafe.Slice((*byte)(unsafe.Pointer(&a.grh.dgid)), 16), g.GRH.DGID[:])
	a.grh.flow_label = C.uint32_t(g.GRH.FlowLabel)
	a.grh.sgid_index = C.uint8_t(g.GRH.SGIDIndex)
	a.grh.hop_limit = C.uint8_t(g.GRH.HopLimit)
	a.grh.traffic_class = C.uint8_t(g.GRH.TrafficClass)
	a.dlid = C.uint16_t(g.DLID)
	a.sl = C.uint8_t(g.SL)
	a.src_path_bits = C.uint8_t(g.SrcPathBits)
	a.static_rate = C.uint8_t(g.StaticRate)
	if g.IsGlobal {
		a.is_global = 1
	}
	a.port_num = C.uint8_t(g.PortNum)
}

//export srCreateAH
func srCreateAH(pd *C.struct_ibv_pd, attr *C.struct_ibv_ah_attr, out **C.struct_ibv_ah) C.int {
	gp, ok := goPD(pd)
	if !ok {
		return C.EINVAL
	}
	ga := goAHAttr(attr)
	ah, err := gp.CreateAH(&ga)
	if err != nil {
		return errno(err)
	}
	ca := (*C.struct_sr_ah)(C.calloc(1, C.sizeof_struct_sr_ah))
	ca.ah.context = pd.context
	ca.ah.pd = pd
	ca.h = reg.put(ah)
	ca.ah.handle = C.uint32_t(ca.h)
	*out = &ca.ah
	return 0
}

//export srDestroyAH
func srDestroyAH(ah *C.struct_ibv_ah) C.int {
	ga, ok := goAH(ah)
	if !ok {
		return C.EINVAL
	}
	if err := ga.Destroy(); err != nil {
		return errno(err)
	}
	ca := (*C.struct_sr_ah)(unsafe.Pointer(ah))
	reg.del(ca.h)
	C.free(unsafe.Pointer(ca))
	return 0
}

// compChannel is a completion channel of C: the C program's cq_context
// pointers stay C memory, keyed by the Go CQ. fd is channel->fd, an epoll
// fd watching the Go channel's eventfd (sr_channel_fd): its O_NONBLOCK is
// the program's to set, and tells ibv_get_cq_event whether to wait.
type compChannel struct {
	ch *verbs.CompChannel
	fd C.int
}

// newCCompChannel makes the C struct of a Go completion channel of the
// C context c.
func newCCompChannel(ch *verbs.CompChannel, c *C.struct_ibv_context) (*C.struct_ibv_comp_channel, error) {
	fd := C.sr_channel_fd(C.int(ch.Fd()))
	if fd < 0 {
		return nil, syscall.Errno(-fd)
	}
	cc := (*C.struct_sr_comp_channel)(C.calloc(1, C.sizeof_struct_sr_comp_channel))
	cc.ch.context = c
	cc.ch.fd = fd
	cc.h = reg.put(&compChannel{ch: ch, fd: fd})
	return &cc.ch, nil
}

// freeCCompChannel frees the C struct of a completion channel (the Go
// channel is destroyed, or is the Go rdmacm's to destroy) and closes its
// fd.
func freeCCompChannel(ch *C.struct_ibv_comp_channel) {
	cc := (*C.struct_sr_comp_channel)(unsafe.Pointer(ch))
	if gch, ok := get[*compChannel](cc.h); ok {
		syscall.Close(int(gch.fd))
	}
	reg.del(cc.h)
	C.free(unsafe.Pointer(cc))
}

//export srCreateCompChannel
func srCreateCompChannel(c *C.struct_ibv_context, out **C.struct_ibv_comp_channel) C.int {
	gc, ok := goContext(c)
	if !ok {
		return C.EINVAL
	}
	ch, err := gc.CreateCompChannel()
	if err != nil {
		return errno(err)
	}
	cch, err := newCCompChannel(ch, c)
	if err != nil {
		ch.Destroy()
		return errno(err)
	}
	*out = cch
	return 0
}

//export srDestroyCompChannel
func srDestroyCompChannel(ch *C.struct_ibv_comp_channel) C.int {
	cc := (*C.struct_sr_comp_channel)(unsafe.Pointer(ch))
	gch, ok := get[*compChannel](cc.h)
	if !ok {
		return C.EINVAL
	}
	if err := gch.ch.Destroy(); err != nil {
		return errno(err)
	}
	freeCCompChannel(ch)
	return 0
}

// srGetCQEvent is ibv_get_cq_event: it waits for an event unless the
// program set O_NONBLOCK on channel->fd (then EAGAIN when none is
// pending), as the read of rdma-core's channel fd does. The flag is read
// at each call: the program may change it at any time.
//
//export srGetCQEvent
func srGetCQEvent(ch *C.struct_ibv_comp_channel, cq **C.struct_ibv_cq, cqctx *unsafe.Pointer) C.int {
	cc := (*C.struct_sr_comp_channel)(unsafe.Pointer(ch))
	gch, ok := get[*compChannel](cc.h)
	if !ok {
		return C.EINVAL
	}
	gch.ch.SetNonblocking(nonblocking(int(gch.fd)))
	gcq, _, err := gch.ch.GetCQEvent(context.Background())
	if err != nil {
		return errno(err)
	}
	reg.mu.Lock()
	c := reg.cqs[gcq]
	reg.mu.Unlock()
	if c == nil {
		return C.EIO
	}
	*cq, *cqctx = C.sr_cq_base(c), C.sr_cq_base(c).cq_context
	return 0
}

// nonblocking tells whether the C program set O_NONBLOCK on fd.
func nonblocking(fd int) bool {
	fl, err := fcntlGetfl(fd)
	return err == nil && fl&syscall.O_NONBLOCK != 0
}

func fcntlGetfl(fd int) (int, error) {
	r, _, e := syscall.Syscall(syscall.SYS_FCNTL, uintptr(fd), syscall.F_GETFL, 0)
	if e != 0 {
		return 0, e
	}
	return int(r), nil
}

//export srAckCQEvents
func srAckCQEvents(cq *C.struct_ibv_cq, n C.uint) {
	if gcq, ok := goCQ(cq); ok {
		gcq.AckEvents(int(n))
	}
}

// cCQ returns the C struct of a CQ, made on first use (the CQs
// rdma_create_qp makes for an id).
func cCQ(gcq *verbs.CQ, ch *C.struct_ibv_comp_channel, cqctx unsafe.Pointer) *C.struct_ibv_cq {
	if gcq == nil {
		return nil
	}
	reg.mu.Lock()
	c := reg.cqs[gcq]
	reg.mu.Unlock()
	if c != nil {
		return C.sr_cq_base(c)
	}
	c = C.sr_cq_alloc(cContext(gcq.Context()), ch, cqctx, C.int(gcq.Cap()))
	c.h = reg.put(gcq)
	c.cqx.handle = C.uint32_t(c.h)
	if ph, ok := gcq.Ops().(pollHinter); ok {
		ph.SetPollHint(hintWord(c))
	}
	reg.mu.Lock()
	reg.cqs[gcq] = c
	reg.mu.Unlock()
	return C.sr_cq_base(c)
}

// pollHinter is a CQ of softverbs: it keeps a word of the C struct up to
// date (sr_cq's hint), which lets ibv_poll_cq return without entering Go
// when there is nothing to poll.
type pollHinter interface {
	SetPollHint(w *atomic.Uint32)
}

// hintWord is the hint of a C CQ as an atomic word.
func hintWord(c *C.struct_sr_cq) *atomic.Uint32 {
	return (*atomic.Uint32)(unsafe.Pointer(&c.hint))
}

// forgetCQ frees the C struct of a destroyed CQ.
func forgetCQ(gcq *verbs.CQ) {
	reg.mu.Lock()
	c := reg.cqs[gcq]
	delete(reg.cqs, gcq)
	reg.mu.Unlock()
	if c != nil {
		if ph, ok := gcq.Ops().(pollHinter); ok {
			ph.SetPollHint(nil) // before the word's memory goes
		}
		reg.del(c.h)
		C.sr_cq_free(c)
	}
}

//export srCreateCQ
func srCreateCQ(c *C.struct_ibv_context, cqe C.int, cqctx unsafe.Pointer, ch *C.struct_ibv_comp_channel, vector C.int, out **C.struct_ibv_cq) C.int {
	gc, ok := goContext(c)
	if !ok {
		return C.EINVAL
	}
	init := verbs.CQInit{Vector: int(vector)}
	if ch != nil {
		gch, ok := get[*compChannel]((*C.struct_sr_comp_channel)(unsafe.Pointer(ch)).h)
		if !ok {
			return C.EINVAL
		}
		init.Channel = gch.ch
	}
	if cqe < 1 {
		return C.EINVAL
	}
	gcq, err := gc.CreateCQEx(int(cqe), init)
	if err != nil {
		return errno(err)
	}
	*out = cCQ(gcq, ch, cqctx)
	return 0
}

//export srDestroyCQ
func srDestroyCQ(cq *C.struct_ibv_cq) C.int {
	gcq, ok := goCQ(cq)
	if !ok {
		return C.EINVAL
	}
	if err := gcq.Destroy(); err != nil {
		return errno(err)
	}
	forgetCQ(gcq)
	return 0
}

//export srReqNotifyCQ
func srReqNotifyCQ(cq *C.struct_ibv_cq, solicited C.int) C.int {
	gcq, ok := goCQ(cq)
	if !ok {
		return C.EINVAL
	}
	return errno(gcq.ReqNotify(solicited != 0))
}

//export srAttachMcast
func srAttachMcast(qp *C.struct_ibv_qp, gid *C.union_ibv_gid, lid C.uint16_t, attach C.int) C.int {
	q, ok := goQP(qp)
	if !ok {
		return C.EINVAL
	}
	gq := q.qp
	var g verbs.GID
	copy(g[:], unsafe.Slice((*byte)(unsafe.Pointer(gid)), 16))
	if attach != 0 {
		return errno(gq.AttachMcast(g, uint16(lid)))
	}
	return errno(gq.DetachMcast(g, uint16(lid)))
}

// releaseContext destroys what a program left of a context it closes: its
// QPs (not those of CM ids), AHs, MRs, CQs and PDs, in that order. Their C
// structs stay allocated (as libibverbs' do) but no longer find an object
// (EINVAL).
func releaseContext(gc *verbs.Context) {
	type obj struct {
		h    uintptr
		rank int
		done func() error
	}
	var objs []obj
	reg.objs.Range(func(k, v any) bool {
		h := k.(uintptr)
		switch o := v.(type) {
		case *cqp:
			if o.id == nil && o.qp.PD().Context() == gc {
				objs = append(objs, obj{h, 0, func() error { o.dropBounce(); return o.qp.Destroy() }})
			}
		case *verbs.AH:
			if o.PD().Context() == gc {
				objs = append(objs, obj{h, 1, o.Destroy})
			}
		case *verbs.MR:
			if o.PD().Context() == gc {
				objs = append(objs, obj{h, 2, o.Dereg})
			}
		case *verbs.CQ:
			if o.Context() == gc {
				objs = append(objs, obj{h, 3, func() error {
					err := o.Destroy()
					if err == nil {
						reg.mu.Lock()
						delete(reg.cqs, o)
						reg.mu.Unlock()
					}
					return err
				}})
			}
		case *verbs.PD:
			if o.Context() == gc {
				objs = append(objs, obj{h, 4, func() error {
					err := o.Dealloc()
					if err == nil {
						reg.mu.Lock()
						delete(reg.pds, o)
						reg.mu.Unlock()
					}
					return err
				}})
			}
		}
		return true
	})
	for rank := 0; rank <= 4; rank++ {
		for _, o := range objs {
			if o.rank == rank && o.done() == nil {
				reg.objs.Delete(o.h)
			}
		}
	}
}

//export srQueryGIDEntry
func srQueryGIDEntry(c *C.struct_ibv_context, port C.uint32_t, index C.uint32_t, out *C.struct_ibv_gid_entry) C.int {
	gc, ok := goContext(c)
	if !ok {
		return C.EINVAL
	}
	if index > 1<<20 {
		return C.EINVAL
	}
	e, err := gc.QueryGIDEntry(uint8(port), int(index))
	if err != nil {
		// An empty entry: ENODATA, as rdma-core.
		p, perr := gc.QueryPort(uint8(port))
		if perr != nil {
			return errno(perr)
		}
		if int(index) < p.GIDTblLen {
			return C.ENODATA
		}
		return errno(err)
	}
	copy(unsafe.Slice((*byte)(unsafe.Pointer(&out.gid)), 16), e.GID[:])
	out.gid_index = C.uint32_t(e.Index)
	out.port_num = C.uint32_t(e.PortNum)
	switch e.Type {
	case verbs.GIDTypeRoCEv2:
		out.gid_type = C.IBV_GID_TYPE_ROCE_V2
	case verbs.GIDTypeRoCEv1:
		out.gid_type = C.IBV_GID_TYPE_ROCE_V1
	default:
		out.gid_type = C.IBV_GID_TYPE_IB
	}
	out.ndev_ifindex = C.uint32_t(e.NetdevIdx)
	return 0
}
