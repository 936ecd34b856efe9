package softverbs

import "github.com/softrdma/softrdma/verbs"

// SubscribeAsync forwards to the provider's asynchronous events
// (verbs.AsyncEventSource); a provider without them gives a cancel that
// does nothing.
func (d *Device) SubscribeAsync(fn func(verbs.AsyncEvent)) (cancel func()) {
	if s, ok := d.drv.(verbs.AsyncEventSource); ok {
		return s.SubscribeAsync(fn)
	}
	return func() {}
}

var _ verbs.AsyncEventSource = (*Device)(nil)
