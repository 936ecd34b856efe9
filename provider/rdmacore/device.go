//go:build rdmacore && cgo

package rdmacore

// #include "shim.h"
import "C"

import (
	"encoding/binary"
	"net"
	"os"
	"strings"
	"sync"
	"syscall"
	"unsafe"

	"github.com/softrdma/softrdma/verbs"
	"github.com/softrdma/softrdma/verbs/driver"
)

// device is a kernel RDMA device (struct ibv_device): driver.DeviceOps.
// One exists per device name for the process (see scan).
type device struct {
	c    *C.struct_ibv_device
	name string

	mu     sync.Mutex
	qctx   *C.struct_ibv_context // opened on first query, kept for the process
	attr   verbs.DeviceAttr
	attrOK bool

	ctrs counters // inspect.go
}

// Name returns the kernel's device name (ibv_get_device_name).
func (d *device) Name() string { return d.name }

// queryContext returns the device's query context, opening it on first
// use (d.mu held).
func (d *device) queryContext() (*C.struct_ibv_context, error) {
	if d.qctx != nil {
		return d.qctx, nil
	}
	c, err := C.ibv_open_device(d.c)
	if c == nil {
		return nil, verbs.Errorf("ibv_open_device", d.name, cerr(err))
	}
	d.qctx = c
	return c, nil
}

// Attr returns the device's attributes (ibv_query_device), queried once;
// the zero DeviceAttr when the device cannot be opened or queried.
// MaxInlineData is 0: struct ibv_device_attr has no such field (the
// inline size of a QP is in its caps).
func (d *device) Attr() verbs.DeviceAttr {
	a, _ := d.queryAttr()
	return a
}

func (d *device) queryAttr() (verbs.DeviceAttr, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.attrOK {
		return d.attr, nil
	}
	c, err := d.queryContext()
	if err != nil {
		return verbs.DeviceAttr{}, err
	}
	var a C.struct_ibv_device_attr
	if rc := C.ibv_query_device(c, &a); rc != 0 {
		return verbs.DeviceAttr{}, verbs.Errorf("ibv_query_device", d.name, ibvErrno(int(rc)))
	}
	d.attr = verbs.DeviceAttr{
		NodeGUID:         binary.BigEndian.Uint64((*[8]byte)(unsafe.Pointer(&a.node_guid))[:]),
		SysImageGUID:     binary.BigEndian.Uint64((*[8]byte)(unsafe.Pointer(&a.sys_image_guid))[:]),
		VendorID:         uint32(a.vendor_id),
		VendorPartID:     uint32(a.vendor_part_id),
		HWVer:            uint32(a.hw_ver),
		FWVer:            C.GoString(&a.fw_ver[0]),
		PhysPortCnt:      uint8(a.phys_port_cnt),
		MaxQP:            int(a.max_qp),
		MaxQPWR:          int(a.max_qp_wr),
		MaxSGE:           int(a.max_sge),
		MaxCQ:            int(a.max_cq),
		MaxCQE:           int(a.max_cqe),
		MaxMR:            int(a.max_mr),
		MaxPD:            int(a.max_pd),
		MaxAH:            int(a.max_ah),
		MaxMcastGrp:      int(a.max_mcast_grp),
		MaxMcastQPAttach: int(a.max_mcast_qp_attach),
		MaxTotalMcastQP:  int(a.max_total_mcast_qp_attach),
	}
	d.attrOK = true
	return d.attr, nil
}

// allGIDs returns the GID tables of all the device's ports.
func (d *device) allGIDs() ([]verbs.GIDEntry, error) {
	a, err := d.queryAttr()
	if err != nil {
		return nil, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return gidTable(d.qctx, d.name, int(a.PhysPortCnt), 0)
}

// Open opens the device (ibv_open_device).
func (d *device) Open() (driver.ContextOps, error) {
	if _, err := d.queryAttr(); err != nil {
		return nil, verbs.OpError("ibv_open_device", d.name, err)
	}
	c, err := C.ibv_open_device(d.c)
	if c == nil {
		return nil, verbs.Errorf("ibv_open_device", d.name, cerr(err))
	}
	return &kctx{dev: d, c: c}, nil
}

// ibvErrno is the errno of a libibverbs call that returns 0 or an errno
// (the positive errno, -errno, or -1 with errno set), as sr_errno.
func ibvErrno(rc int) syscall.Errno {
	return syscall.Errno(C.sr_errno(C.int(rc)))
}

// gidTable returns the valid GID entries of port (0: of every port) of a
// device with ports ports (ibv_query_gid_table).
func gidTable(c *C.struct_ibv_context, name string, ports int, port uint8) ([]verbs.GIDEntry, error) {
	total := 0
	for p := 1; p <= ports; p++ {
		var pa C.struct_ibv_port_attr
		if rc := C.sr_query_port(c, C.uint8_t(p), &pa); rc != 0 {
			return nil, verbs.Errorf("ibv_query_port", name, syscall.Errno(rc))
		}
		total += int(pa.gid_tbl_len)
	}
	if total == 0 {
		return nil, nil
	}
	buf := (*C.struct_ibv_gid_entry)(C.calloc(C.size_t(total), C.sizeof_struct_ibv_gid_entry))
	if buf == nil {
		return nil, verbs.Errorf("ibv_query_gid_table", name, syscall.ENOMEM)
	}
	defer C.free(unsafe.Pointer(buf))
	n, err := C.ibv_query_gid_table(c, buf, C.size_t(total), 0)
	if n < 0 {
		e := syscall.Errno(-n)
		if n == -1 {
			e = cerr(err)
		}
		return nil, verbs.Errorf("ibv_query_gid_table", name, e)
	}
	var out []verbs.GIDEntry
	for _, e := range unsafe.Slice(buf, int(n)) {
		if port != 0 && uint8(e.port_num) != port {
			continue
		}
		out = append(out, verbs.GIDEntry{
			GID:       *(*verbs.GID)(unsafe.Pointer(&e.gid)),
			Index:     int(e.gid_index),
			PortNum:   uint8(e.port_num),
			Type:      verbs.GIDType(e.gid_type),
			NetdevIdx: int(e.ndev_ifindex),
		})
	}
	return out, nil
}

// kctx is an open kernel device (struct ibv_context): driver.ContextOps.
type kctx struct {
	dev *device
	c   *C.struct_ibv_context

	mu       sync.RWMutex // closed (write), calls on c (read)
	closed   bool
	pds, cqs int            // EBUSY for Close: ibv_close_device itself frees them all
	readers  []*asyncReader // SubscribeAsync's (async.go): Close ends them
}

// use counts PDs and CQs made or freed; EINVAL once closed.
func (k *kctx) use(pds, cqs int) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.closed {
		return syscall.EINVAL
	}
	k.pds += pds
	k.cqs += cqs
	return nil
}

// QueryPort returns a port's attributes (ibv_query_port); the kernel
// checks the port number. NetdevMTU is the MTU of the network interface
// of the port's GIDs (RoCE), 0 when it has none (InfiniBand).
func (k *kctx) QueryPort(port uint8) (verbs.PortAttr, error) {
	k.mu.RLock()
	defer k.mu.RUnlock()
	if k.closed {
		return verbs.PortAttr{}, verbs.Errorf("ibv_query_port", k.dev.name, syscall.EINVAL)
	}
	var pa C.struct_ibv_port_attr
	if rc := C.sr_query_port(k.c, C.uint8_t(port), &pa); rc != 0 {
		return verbs.PortAttr{}, verbs.Errorf("ibv_query_port", k.dev.name, syscall.Errno(rc))
	}
	out := verbs.PortAttr{
		State:      verbs.PortState(pa.state),
		MaxMTU:     verbs.MTU(pa.max_mtu),
		ActiveMTU:  verbs.MTU(pa.active_mtu),
		GIDTblLen:  int(pa.gid_tbl_len),
		PKeyTblLen: int(pa.pkey_tbl_len),
		LID:        uint16(pa.lid),
		SMLID:      uint16(pa.sm_lid),
		LMC:        uint8(pa.lmc),
		SMSL:       uint8(pa.sm_sl),
		LinkLayer:  verbs.LinkLayer(pa.link_layer),
	}
	if out.LinkLayer == verbs.LinkLayerEthernet {
		out.NetdevMTU = k.netdevMTU(port)
	}
	return out, nil
}

// netdevMTU finds the MTU of the port's network interface: the netdev of
// its GID entries, else sysfs's gid_attrs/ndevs/0 (k.mu read-held).
func (k *kctx) netdevMTU(port uint8) int {
	a := k.dev.Attr()
	if tbl, err := gidTable(k.c, k.dev.name, int(a.PhysPortCnt), port); err == nil {
		for _, e := range tbl {
			if e.NetdevIdx == 0 {
				continue
			}
			if ifi, err := net.InterfaceByIndex(e.NetdevIdx); err == nil {
				return ifi.MTU
			}
		}
	}
	b, err := os.ReadFile("/sys/class/infiniband/" + k.dev.name + "/ports/" + itoa(int(port)) + "/gid_attrs/ndevs/0")
	if err != nil {
		return 0
	}
	if ifi, err := net.InterfaceByName(strings.TrimSpace(string(b))); err == nil {
		return ifi.MTU
	}
	return 0
}

func itoa(n int) string {
	if n == 0 {
		return "0"
	}
	var b [20]byte
	i := len(b)
	for n > 0 {
		i--
		b[i] = byte('0' + n%10)
		n /= 10
	}
	return string(b[i:])
}

// QueryGIDTable returns the port's valid GID entries
// (ibv_query_gid_table): type IB, RoCE v1 or RoCE v2 and the interface
// index of the entry's netdev. The kernel checks the port number.
func (k *kctx) QueryGIDTable(port uint8) ([]verbs.GIDEntry, error) {
	k.mu.RLock()
	defer k.mu.RUnlock()
	if k.closed {
		return nil, verbs.Errorf("ibv_query_gid_table", k.dev.name, syscall.EINVAL)
	}
	var pa C.struct_ibv_port_attr
	if rc := C.sr_query_port(k.c, C.uint8_t(port), &pa); rc != 0 {
		return nil, verbs.Errorf("ibv_query_gid_table", k.dev.name, syscall.Errno(rc))
	}
	a := k.dev.Attr()
	tbl, err := gidTable(k.c, k.dev.name, int(a.PhysPortCnt), port)
	if err != nil {
		return nil, verbs.OpError("ibv_query_gid_table", k.dev.name, err)
	}
	return tbl, nil
}

// AllocPD allocates a protection domain (ibv_alloc_pd).
func (k *kctx) AllocPD() (driver.PDOps, error) {
	if err := k.use(1, 0); err != nil {
		return nil, verbs.Errorf("ibv_alloc_pd", k.dev.name, syscall.EINVAL)
	}
	c, err := C.ibv_alloc_pd(k.c)
	if c == nil {
		_ = k.use(-1, 0)
		return nil, verbs.Errorf("ibv_alloc_pd", k.dev.name, cerr(err))
	}
	p := &pd{ctx: k, c: c}
	p.gone = watch(p, "protection domain (ibv_pd)")
	return p, nil
}

// CreateCQ creates a CQ of at least cqe entries (ibv_create_cq): with the
// program's completion channel ch, or else with a channel of its own for
// Wait (ibv_create_comp_channel).
func (k *kctx) CreateCQ(cqe int, ch driver.CompChannelOps, vector int) (driver.CQOps, error) {
	var user *compChannel
	if ch != nil {
		var ok bool
		if user, ok = ch.(*compChannel); !ok || user.ctx != k {
			return nil, verbs.Errorf("ibv_create_cq", k.dev.name, syscall.EINVAL)
		}
	}
	if err := k.use(0, 1); err != nil {
		return nil, verbs.Errorf("ibv_create_cq", k.dev.name, syscall.EINVAL)
	}
	q, err := newCQ(k, cqe, user, vector)
	if err != nil {
		_ = k.use(0, -1)
		return nil, verbs.OpError("ibv_create_cq", k.dev.name, err)
	}
	return q, nil
}

// Close closes the context (ibv_close_device): EBUSY while PDs or CQs of
// it exist (the kernel would free them under their handles), EINVAL when
// closed already.
func (k *kctx) Close() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	switch {
	case k.closed:
		return verbs.Errorf("ibv_close_device", k.dev.name, syscall.EINVAL)
	case k.pds > 0 || k.cqs > 0:
		return verbs.Errorf("ibv_close_device", k.dev.name, syscall.EBUSY)
	}
	if rc := C.ibv_close_device(k.c); rc != 0 {
		return verbs.Errorf("ibv_close_device", k.dev.name, ibvErrno(int(rc)))
	}
	k.closed = true
	for _, r := range k.readers {
		r.stop()
	}
	return nil
}
