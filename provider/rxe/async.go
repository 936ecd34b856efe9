package rxe

import (
	"github.com/softrdma/softrdma/verbs"
	"github.com/softrdma/softrdma/verbs/driver"
)

// SubscribeAsync reports the interface's changes as libibverbs'
// asynchronous events of port 1 (driver.AsyncEventSource, through the
// verbs core), as the kernel's rxe (rxe_notify: rxe_port_up,
// rxe_port_down) and GID cache raise them: the interface going down or
// losing its carrier is IBV_EVENT_PORT_ERR, coming back up and running
// IBV_EVENT_PORT_ACTIVE (one event per change of the state QueryPort
// reports, where the kernel's rxe may raise PORT_ACTIVE twice, on
// NETDEV_UP and again on the carrier's NETDEV_CHANGE); the interface
// removed is IBV_EVENT_PORT_ERR; an address added or removed changes the
// GID table (IBV_EVENT_GID_CHANGE).
func (d *Device) SubscribeAsync(fn func(verbs.AsyncEvent)) (cancel func()) {
	return d.subscribe(subscriber{
		netdev: func(ev driver.NetdevEvent) {
			t := verbs.EventGIDChange
			if ev.Kind == driver.NetdevRemoved {
				t = verbs.EventPortErr
			}
			fn(verbs.AsyncEvent{Type: t, PortNum: 1})
		},
		port: func(up bool) {
			t := verbs.EventPortErr
			if up {
				t = verbs.EventPortActive
			}
			fn(verbs.AsyncEvent{Type: t, PortNum: 1})
		},
	})
}

var _ driver.AsyncEventSource = (*Device)(nil)
