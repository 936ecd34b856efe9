package rdmacm

import (
	"fmt"
	"syscall"
	"time"

	"github.com/softrdma/softrdma/verbs"
)

// ResolveRoute resolves the route of an id whose address is resolved
// (rdma_resolve_route): the id becomes ROUTE_RESOLVED and the result comes
// as a ROUTE_RESOLVED (or, from the kernel, ROUTE_ERROR) event; a
// synchronous id waits for it. Any other state → EINVAL. As in the kernel,
// an id whose route is resolved can no longer join a group (the join wants
// an id that is bound or address-resolved): multicast ids do not resolve
// routes. On softrdma's devices the route is the port's own (RoCE: no
// neighbour resolution; InfiniBand: no SA PathRecord query).
func (id *ID) ResolveRoute(timeout time.Duration) (err error) {
	defer wrapErr(&err, "rdma_resolve_route", nil)
	return id.engine().resolveRoute(id, timeout)
}

// SrcPort returns the id's source port (rdma_get_src_port), in host order
// (C returns it in network order): the port of an IP address, the low 16
// bits of an AF_IB address's service id; 0 when the id has no address.
func (id *ID) SrcPort() uint16 {
	id.mu.Lock()
	defer id.mu.Unlock()
	return id.eng.srcPort(id)
}

// DstPort returns the id's destination port (rdma_get_dst_port), in host
// order, as SrcPort.
func (id *ID) DstPort() uint16 {
	id.mu.Lock()
	defer id.mu.Unlock()
	return id.eng.dstPort(id)
}

// portOf is librdmacm's ucma_get_port.
func (s sockaddr) portOf() uint16 {
	switch s.family {
	case syscall.AF_INET, syscall.AF_INET6:
		return s.port
	case afIB:
		return uint16(s.ib.SID)
	}
	return 0
}

// GetDevices returns the opened device contexts of every RDMA device
// (rdma_get_devices): the contexts ids bound to the devices use (ID.Verbs),
// kernel devices included in a build with the rdmacore tag. No device →
// ENODEV.
func GetDevices() ([]*verbs.Context, error) {
	return GetDevicesOn(verbs.DefaultHost())
}

// GetDevicesOn is GetDevices for the devices of host h.
func GetDevicesOn(h *verbs.Host) (_ []*verbs.Context, err error) {
	defer wrapErr(&err, "rdma_get_devices", nil)
	cm := cmOf(h)
	var ctxs []*verbs.Context
	for _, vd := range h.DeviceList() {
		cd, err := cm.deviceFor(vd)
		if err != nil {
			// librdmacm marks a device it cannot open dead and skips it.
			continue
		}
		ctxs = append(ctxs, cd.ctx)
	}
	if len(ctxs) == 0 {
		return nil, fmt.Errorf("no RDMA device: %w", syscall.ENODEV)
	}
	return ctxs, nil
}

// FreeDevices releases a list GetDevices returned (rdma_free_devices).
// The contexts stay open for the ids, as in librdmacm; in Go there is
// nothing to free.
func FreeDevices([]*verbs.Context) {}

// CreateEP creates a synchronous id as res says (rdma_create_ep): of
// res.PortSpace (and res.QPType for RDMA_PS_IB). With RAI_PASSIVE in
// res.Flags the id is bound to res.SrcAddr; pd, if given, becomes the
// id's PD (ID.PD, the default of CreateQP) and no QP is made (librdmacm
// keeps attr for connection requests, which UD ids do not have). Otherwise the id resolves
// res.DstAddr from res.SrcAddr (2 s) and its route (res.Route as
// OptionIBPath, else ResolveRoute, 2 s), and with attr creates its QP on
// pd (attr.QPType is set to res.QPType). A failed step destroys the id
// and returns that step's error under rdma_create_ep.
//
// For multicast, use a passive endpoint: as in the kernel, an id whose
// route is resolved cannot join a group (EINVAL).
func CreateEP(res *AddrInfo, pd *verbs.PD, attr *verbs.QPInitAttr) (_ *ID, err error) {
	defer wrapErr(&err, "rdma_create_ep", nil)
	if res == nil {
		return nil, fmt.Errorf("nil addrinfo: %w", syscall.EINVAL)
	}
	id, err := createID(nil, nil, res.PortSpace, res.QPType)
	if err != nil {
		return nil, err
	}
	if err := id.createEP(res, pd, attr); err != nil {
		DestroyEP(id)
		return nil, err
	}
	return id, nil
}

func (id *ID) createEP(res *AddrInfo, pd *verbs.PD, attr *verbs.QPInitAttr) error {
	if res.Flags&RAI_PASSIVE != 0 {
		if err := id.BindAddr(res.SrcAddr); err != nil {
			return err
		}
		id.mu.Lock()
		defer id.mu.Unlock()
		if pd != nil {
			id.userPD = pd
		}
		// librdmacm keeps attr for rdma_get_request, which UD ids do
		// not have.
		return nil
	}
	if err := id.ResolveAddr(res.SrcAddr, res.DstAddr, 2*time.Second); err != nil {
		return err
	}
	if len(res.Route) > 0 {
		if err := id.SetOption(OptionIB, OptionIBPath, res.Route); err != nil {
			return err
		}
		if err := id.complete(nil); err != nil {
			return err
		}
	} else if err := id.ResolveRoute(2 * time.Second); err != nil {
		return err
	}
	if attr != nil {
		attr.QPType = res.QPType
		if err := id.CreateQP(pd, attr); err != nil {
			return err
		}
	}
	return nil
}

// DestroyEP destroys an endpoint (rdma_destroy_ep): its QP, then the id.
// C returns nothing; the error is the id's Destroy's.
func DestroyEP(id *ID) error {
	if id.QP() != nil {
		id.DestroyQP()
	}
	return id.Destroy()
}
