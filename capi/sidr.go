//go:build capi

package main

/*
#include <stdlib.h>
#include <string.h>
#include <capi.h>
*/
import "C"

import (
	"unsafe"

	"github.com/softrdma/softrdma/rdmacm"
)

// UD connections (sidr.c): rdma_listen, rdma_connect, rdma_accept and
// rdma_reject over rdmacm's SIDR.

// goConnParam converts a struct rdma_conn_param (nil: none).
func goConnParam(p *C.struct_rdma_conn_param) *rdmacm.ConnParam {
	if p == nil {
		return nil
	}
	cp := &rdmacm.ConnParam{
		ResponderResources: uint8(p.responder_resources), InitiatorDepth: uint8(p.initiator_depth),
		FlowControl: uint8(p.flow_control), RetryCount: uint8(p.retry_count),
		RNRRetryCount: uint8(p.rnr_retry_count), SRQ: p.srq != 0, QPNum: uint32(p.qp_num),
	}
	if p.private_data != nil && p.private_data_len > 0 {
		cp.PrivateData = C.GoBytes(p.private_data, C.int(p.private_data_len))
	}
	return cp
}

//export srListen
func srListen(id *C.struct_rdma_cm_id, backlog C.int) C.int {
	ci, ok := goID(id)
	if !ok {
		return C.EINVAL
	}
	err := ci.id.Listen(int(backlog))
	ci.sync()
	return errno(err)
}

//export srConnect
func srConnect(id *C.struct_rdma_cm_id, p *C.struct_rdma_conn_param) C.int {
	ci, ok := goID(id)
	if !ok {
		return C.EINVAL
	}
	err := ci.id.Connect(goConnParam(p))
	ci.sync()
	return errno(err)
}

//export srAccept
func srAccept(id *C.struct_rdma_cm_id, p *C.struct_rdma_conn_param) C.int {
	ci, ok := goID(id)
	if !ok {
		return C.EINVAL
	}
	return errno(ci.id.Accept(goConnParam(p)))
}

//export srReject
func srReject(id *C.struct_rdma_cm_id, data unsafe.Pointer, n C.uint8_t) C.int {
	ci, ok := goID(id)
	if !ok {
		return C.EINVAL
	}
	var pd []byte
	if data != nil && n > 0 {
		pd = C.GoBytes(data, C.int(n))
	}
	return errno(ci.id.Reject(pd))
}

// connRequestID returns the C id of a CONNECT_REQUEST's new id, made on
// first sight like librdmacm's ucma_process_conn_req: the listening id's
// channel, context and port space.
func connRequestID(ev *rdmacm.Event) *cmID {
	ids.Lock()
	lci := ids.m[ev.ListenID]
	ids.Unlock()
	if lci == nil {
		return nil
	}
	newCmID(ev.ID, lci.c.id.channel, lci.c.id.context, lci.c.id.ps)
	ids.Lock()
	defer ids.Unlock()
	return ids.m[ev.ID]
}

// putUDConnEvent fills the UD part of a UD connection's event (a
// CONNECT_REQUEST, ESTABLISHED or UNREACHABLE with private data) and
// returns the malloc'd private data the ack frees (nil: none).
func putUDConnEvent(c *C.struct_sr_event, ev *rdmacm.Event, listen *cmID) unsafe.Pointer {
	if listen != nil {
		c.ev.listen_id = &listen.c.id
	}
	pd, ok := ev.Param.PrivateData.([]byte)
	ud := C.sr_event_ud(&c.ev)
	putAHAttr(&ud.ah_attr, &ev.Param.AHAttr)
	ud.qp_num = C.uint32_t(ev.Param.QPNum)
	ud.qkey = C.uint32_t(ev.Param.QKey)
	if !ok || len(pd) == 0 {
		return nil
	}
	p := C.CBytes(pd)
	ud.private_data = p
	ud.private_data_len = C.uint8_t(len(pd))
	return p
}
