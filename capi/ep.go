//go:build capi

package main

/*
#include <stdlib.h>
#include <string.h>
#include <capi.h>
*/
import "C"

import (
	"syscall"
	"unsafe"

	"github.com/softrdma/softrdma/rdmacm"
	"github.com/softrdma/softrdma/rdmacm/saclient"
	"github.com/softrdma/softrdma/verbs"
)

// newCmID wraps a Go id in its C struct.
func newCmID(id *rdmacm.ID, ch *C.struct_rdma_event_channel, ctx unsafe.Pointer, ps C.enum_rdma_port_space) *C.struct_rdma_cm_id {
	c := (*C.struct_sr_id)(C.calloc(1, C.sizeof_struct_sr_id))
	c.id.channel = ch
	c.id.context = ctx
	c.id.ps = ps
	c.id.qp_type = uint32(id.QPType())
	ci := &cmID{id: id, c: c}
	c.h = reg.put(ci)
	ids.Lock()
	ids.m[id] = ci
	ids.Unlock()
	return &c.id
}

// srCreateEP is rdma_create_ep without the QP: the C side creates it with
// rdma_create_qp (rdmacm.c), so that its C structs are the ones
// rdma_create_qp makes.
//
//export srCreateEP
func srCreateEP(res *C.struct_rdma_addrinfo, pd *C.struct_ibv_pd, out **C.struct_rdma_cm_id) C.int {
	ai := &rdmacm.AddrInfo{
		Flags: int(res.ai_flags), Family: int(res.ai_family),
		QPType: verbs.QPType(res.ai_qp_type), PortSpace: rdmacm.PortSpace(res.ai_port_space),
	}
	var err error
	if res.ai_src_len != 0 && res.ai_src_addr != nil {
		if ai.SrcAddr, err = goAddr(res.ai_src_addr); err != nil {
			return errno(err)
		}
	}
	if res.ai_dst_len != 0 && res.ai_dst_addr != nil {
		if ai.DstAddr, err = goAddr(res.ai_dst_addr); err != nil {
			return errno(err)
		}
	}
	if res.ai_route_len != 0 && res.ai_route != nil {
		ai.Route = C.GoBytes(res.ai_route, C.int(res.ai_route_len))
	}
	var gpd *verbs.PD
	if pd != nil {
		var ok bool
		if gpd, ok = goPD(pd); !ok {
			return C.EINVAL
		}
	}
	id, err := rdmacm.CreateEP(ai, gpd, nil)
	if err != nil {
		return errno(err)
	}
	c := newCmID(id, nil, nil, C.enum_rdma_port_space(res.ai_port_space))
	ci, _ := goID(c)
	ci.sync()
	if res.ai_flags&C.RAI_PASSIVE != 0 {
		c.pd = pd
	}
	*out = c
	return 0
}

// rdmaUDPQKey is RDMA_UDP_QKEY, the Q_Key of RDMA_PS_UDP and RDMA_PS_IB
// ids.
const rdmaUDPQKey = 0x01234567

// idQKey is the Q_Key rdma_init_qp_attr gives a UD id, as the kernel's
// cma_set_qkey: the Q_Key the id's QP was given, else RDMA_UDP_QKEY for
// RDMA_PS_UDP and RDMA_PS_IB, else (RDMA_PS_IPOIB) the Q_Key of the IB
// port's IPoIB broadcast group, which a RoCE port does not have (ENODEV).
func idQKey(id *rdmacm.ID) (uint32, error) {
	if qp := id.QP(); qp != nil {
		if a := qp.Query(); a.State != verbs.QPSReset && a.QKey != 0 {
			return a.QKey, nil
		}
	}
	if id.PortSpace() != rdmacm.PS_IPOIB {
		return rdmaUDPQKey, nil
	}
	if vc := id.Verbs(); vc != nil {
		if sa, ok := saclient.For(vc.Device()); ok {
			if bc, ok := sa.BroadcastGroup(); ok {
				return bc.QKey, nil
			}
		}
	}
	return 0, syscall.ENODEV
}

// srInitQPAttr is rdma_init_qp_attr as the kernel answers it for an id
// without a connection (every UD id): whatever state is asked for, the
// attributes of cma_ib_init_qp_attr (P_Key index, port, and the Q_Key for
// a UD id, the access flags, none, for another), every other field zero.
// An id without a device gets EINVAL, as ucma_init_qp_attr.
//
//export srInitQPAttr
func srInitQPAttr(id *C.struct_rdma_cm_id, attr *C.struct_ibv_qp_attr, mask *C.int) C.int {
	ci, ok := goID(id)
	if !ok {
		return C.EINVAL
	}
	if ci.id.Verbs() == nil {
		return C.EINVAL
	}
	state := attr.qp_state
	m := C.int(C.IBV_QP_STATE | C.IBV_QP_PKEY_INDEX | C.IBV_QP_PORT)
	var qkey uint32
	if ci.id.QPType() == verbs.QPTypeUD {
		var err error
		if qkey, err = idQKey(ci.id); err != nil {
			return errno(err)
		}
		m |= C.IBV_QP_QKEY
	} else {
		m |= C.IBV_QP_ACCESS_FLAGS
	}
	C.memset(unsafe.Pointer(attr), 0, C.sizeof_struct_ibv_qp_attr)
	attr.qp_state = state
	attr.pkey_index = 0 // the default P_Key, 0xffff, the only one
	attr.port_num = C.uint8_t(ci.id.PortNum())
	attr.qkey = C.uint32_t(qkey)
	*mask = m
	return 0
}
