package rxe

import "github.com/softrdma/softrdma/verbs"

// SubscribeAsync reports the interface's changes as libibverbs'
// asynchronous events of port 1 (verbs.AsyncEventSource, through the
// verbs core): the interface removed is IBV_EVENT_PORT_ERR, an address
// added or removed changes the GID table (IBV_EVENT_GID_CHANGE), as the
// kernel's rxe and GID cache raise them. Link up and down without an
// address change raise nothing yet.
func (d *Device) SubscribeAsync(fn func(verbs.AsyncEvent)) (cancel func()) {
	return d.WatchNetdev(func(ev verbs.NetdevEvent) {
		t := verbs.EventGIDChange
		if ev.Kind == verbs.NetdevRemoved {
			t = verbs.EventPortErr
		}
		fn(verbs.AsyncEvent{Type: t, PortNum: 1})
	})
}

var _ verbs.AsyncEventSource = (*Device)(nil)
