package softverbs

import (
	"github.com/softrdma/softrdma/verbs"
	"github.com/softrdma/softrdma/verbs/driver"
)

// SubscribeAsync forwards to the provider's asynchronous events
// (driver.AsyncEventSource); a provider without them gives a cancel that
// does nothing.
func (d *Device) SubscribeAsync(fn func(verbs.AsyncEvent)) (cancel func()) {
	if s, ok := d.drv.(driver.AsyncEventSource); ok {
		return s.SubscribeAsync(fn)
	}
	return func() {}
}

var _ driver.AsyncEventSource = (*Device)(nil)
