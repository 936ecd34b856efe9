//go:build rdmacore && cgo

package rdmacore

// #cgo LDFLAGS: -lrdmacm -libverbs
// #include <stdint.h>
import "C"

import "unsafe"

// cptr passes p, which points to C memory, to a C function as an integer
// (the shim's sr_*_u calls): unlike a pointer argument it costs no cgo
// pointer check. Never pass a pointer to Go memory this way: the collector
// would not see C's use of it.
func cptr[T any](p *T) C.uintptr_t { return C.uintptr_t(uintptr(unsafe.Pointer(p))) }
