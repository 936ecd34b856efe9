//go:build rdmacore && cgo

package rdmacore

// #include "shim.h"
import "C"

import "github.com/softrdma/softrdma/verbs"

// The C objects under the public handles, for the package's librdmacm
// part: nil when the handle is not this backend's (or its object is
// gone).

// cDevice returns the ibv_device of a kernel device.
func cDevice(d *verbs.Device) *C.struct_ibv_device {
	if d == nil {
		return nil
	}
	if kd, ok := d.Ops().(*device); ok {
		return kd.c
	}
	return nil
}

// cContext returns the ibv_context of an open kernel device.
func cContext(c *verbs.Context) *C.struct_ibv_context {
	if c == nil {
		return nil
	}
	if k, ok := c.Ops().(*kctx); ok {
		return k.c
	}
	return nil
}

// cPD returns the ibv_pd of a PD of this backend.
func cPD(h *verbs.PD) *C.struct_ibv_pd {
	if h == nil {
		return nil
	}
	if p, ok := h.Ops().(*pd); ok {
		return p.c
	}
	return nil
}

// cQP returns the ibv_qp of a QP of this backend.
func cQP(h *verbs.QP) *C.struct_ibv_qp {
	if h == nil {
		return nil
	}
	if q, ok := h.Ops().(*qp); ok {
		return q.c
	}
	return nil
}

// deviceNamed returns the process's kernel device of that name (as
// ibv_get_device_name gives it, e.g. of a CM id's verbs context), scanning
// the device list when it is not known yet; nil when there is none.
func deviceNamed(name string) *device {
	kernel.Lock()
	d := kernel.devs[name]
	kernel.Unlock()
	if d != nil {
		return d
	}
	for _, d := range scan() {
		if d.name == name {
			return d
		}
	}
	return nil
}
