//go:build rdmacore && cgo

package rdmacore

import (
	"fmt"
	"os"
	"runtime"
	"sync/atomic"
)

// Dropped handles. A verbs object of this backend holds a C object that
// only its Destroy (Dealloc, Dereg, Close) frees; Go's collector cannot
// free it, since the C library and the kernel may still use it. A handle
// dropped without that call is a leak in the program: when the collector
// finds the handle unreachable, the backend says so on stderr, once per
// object, naming its kind.

// freed records that a handle's C object was freed. It is an allocation
// of its own, apart from the handle, so that the handle's cleanup can
// read it after the handle is gone.
type freed struct{ done atomic.Bool }

// set records the free.
func (f *freed) set() { f.done.Store(true) }

// watch arranges the report of h's leak unless f is set before the
// collector finds h unreachable.
func watch[T any](h *T, kind string) *freed {
	f := &freed{}
	runtime.AddCleanup(h, func(f *freed) {
		if !f.done.Load() {
			reportLeak(kind)
		}
	}, f)
	return f
}

// leakHook, when set (by tests), takes the reports instead of stderr.
var leakHook atomic.Pointer[func(kind string)]

// reportLeak reports a dropped handle.
func reportLeak(kind string) {
	if h := leakHook.Load(); h != nil {
		(*h)(kind)
		return
	}
	fmt.Fprintf(os.Stderr, "softrdma rdmacore: a %s was dropped without being destroyed: its C object leaks\n", kind)
}
