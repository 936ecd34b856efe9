//go:build rdmacore && cgo

package cm

/*
#include <endian.h>
#include <errno.h>
#include <stdlib.h>
#include <rdma/rdma_cma.h>

// sr_set_option is rdma_set_option with the option's bytes (NULL for
// none): the kernel checks level, option and length.
static int sr_set_option(struct rdma_cm_id *id, int level, int name, void *val, size_t len) {
	return rdma_set_option(id, level, name, val, len) ? errno : 0;
}

static int sr_resolve_route(struct rdma_cm_id *id, int ms) {
	return rdma_resolve_route(id, ms) ? errno : 0;
}

// sr_port returns the id's source (which 0) or destination (1) port in
// host order (rdma_get_src_port / rdma_get_dst_port give network order).
static int sr_port(struct rdma_cm_id *id, int which) {
	return be16toh(which ? rdma_get_dst_port(id) : rdma_get_src_port(id));
}
*/
import "C"

import (
	"syscall"
	"unsafe"
)

// SetOption sets an option of the id (rdma_set_option): level, option
// and value as C gives them (val's length is optlen; nil for none).
func (id *CMID) SetOption(level, name int, val []byte) error {
	var p unsafe.Pointer
	if len(val) > 0 {
		// C copies the value during the call (the kernel's memdup_user).
		p = C.CBytes(val)
		defer C.free(p)
	}
	c := id.use()
	defer id.life.RUnlock()
	if c == nil {
		return syscall.EINVAL
	}
	return errnoOf(C.sr_set_option(c, C.int(level), C.int(name), p, C.size_t(len(val))))
}

// ResolveRoute starts the route resolution of an id whose address is
// resolved (rdma_resolve_route); ROUTE_RESOLVED or ROUTE_ERROR follows. An
// id bound to no device is EINVAL, the kernel's answer for it: librdmacm
// itself would dereference the id's NULL device (id->verbs) and crash.
func (id *CMID) ResolveRoute(timeoutMS int) error {
	c := id.use()
	defer id.life.RUnlock()
	if c == nil || c.verbs == nil {
		return syscall.EINVAL
	}
	return errnoOf(C.sr_resolve_route(c, C.int(timeoutMS)))
}

// SrcPort returns the id's source port (rdma_get_src_port), in host order;
// 0 once destroyed.
func (id *CMID) SrcPort() uint16 { return id.port(0) }

// DstPort returns the id's destination port (rdma_get_dst_port), in host
// order; 0 once destroyed.
func (id *CMID) DstPort() uint16 { return id.port(1) }

func (id *CMID) port(which C.int) uint16 {
	c := id.use()
	defer id.life.RUnlock()
	if c == nil {
		return 0
	}
	return uint16(C.sr_port(c, which))
}
