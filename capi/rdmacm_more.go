//go:build capi

package main

/*
#include <stdlib.h>
#include <capi.h>
*/
import "C"

import (
	"unsafe"

	"github.com/softrdma/softrdma/rdmacm"
)

//export srSetOption
func srSetOption(id *C.struct_rdma_cm_id, level, name C.int, val unsafe.Pointer, n C.size_t) C.int {
	ci, ok := goID(id)
	if !ok {
		return C.EINVAL
	}
	// The C bytes as they are: rdmacm checks the size of each option
	// (EINVAL) as the kernel does.
	b := []byte{}
	if n > 0 {
		b = C.GoBytes(val, C.int(n))
	}
	return errno(ci.id.SetOption(int(level), int(name), b))
}

//export srMigrateID
func srMigrateID(id *C.struct_rdma_cm_id, ch *C.struct_rdma_event_channel) C.int {
	ci, ok := goID(id)
	if !ok {
		return C.EINVAL
	}
	var gch *rdmacm.EventChannel
	if ch != nil {
		ec, ok := get[*eventChannel]((*C.struct_sr_channel)(unsafe.Pointer(ch)).h)
		if !ok {
			return C.EINVAL
		}
		gch = ec.ch
	}
	old := channelOf(id.channel)
	if err := ci.id.MigrateID(gch); err != nil {
		return errno(err)
	}
	id.channel = ch
	// The id's queued events moved: each fd tells at once, as the
	// kernel's files do.
	old.refresh()
	channelOf(ch).refresh()
	ci.sync()
	return 0
}

//export srGetDevices
func srGetDevices(num *C.int, out ***C.struct_ibv_context) C.int {
	ctxs, err := rdmacm.GetDevices()
	if err != nil {
		return errno(err)
	}
	list := (**C.struct_ibv_context)(C.calloc(C.size_t(len(ctxs)+1), C.size_t(unsafe.Sizeof(uintptr(0)))))
	if list == nil {
		return C.ENOMEM
	}
	s := unsafe.Slice(list, len(ctxs)+1)
	for i, c := range ctxs {
		s[i] = cContext(c)
	}
	*num, *out = C.int(len(ctxs)), list
	return 0
}
