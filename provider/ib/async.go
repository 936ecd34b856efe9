package ib

import (
	"github.com/softrdma/softrdma/verbs"
	"github.com/softrdma/softrdma/verbs/driver"
)

// asyncType is the libibverbs event of a port event.
var asyncType = map[PortEventKind]verbs.AsyncEventType{
	ClientReregister: verbs.EventClientReregister,
	LIDChange:        verbs.EventLIDChange,
	PortError:        verbs.EventPortErr,
	PortActive:       verbs.EventPortActive,
}

// SubscribeAsync reports the port's events as libibverbs' asynchronous
// events of port 1 (driver.AsyncEventSource, through the verbs core): the
// SM lost (IBV_EVENT_PORT_ERR) and back (IBV_EVENT_PORT_ACTIVE), a new
// LID (IBV_EVENT_LID_CHANGE) and an SM restart
// (IBV_EVENT_CLIENT_REREGISTER), as the kernel's port events.
func (d *Device) SubscribeAsync(fn func(verbs.AsyncEvent)) (cancel func()) {
	return d.Watch(func(ev PortEvent) {
		if t, ok := asyncType[ev.Kind]; ok {
			fn(verbs.AsyncEvent{Type: t, PortNum: 1})
		}
	})
}

var _ driver.AsyncEventSource = (*Device)(nil)
