package rxe

import (
	"bytes"
	"maps"
	"net/netip"
	"runtime"
	"slices"
	"sync"

	"github.com/softrdma/softrdma/verbs"
	"github.com/softrdma/softrdma/verbs/driver"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// events is the device's netlink watcher and its subscribers.
type events struct {
	mu     sync.Mutex
	subs   map[int]subscriber
	nextID int
	done   chan struct{} // closes the watcher; nil when not running
	live   bool          // the watcher receives link and address changes
	exited chan struct{}
	// linkUp is the port state last reported to subscribers (the
	// interface up and running), kept by the watcher.
	linkUp bool

	// The dispatch in progress: dmu guards it, dcond signals its end.
	dmu        sync.Mutex
	dcond      *sync.Cond
	dispatchBy uint64 // the goroutine running callbacks (0: none)
}

// goid returns the current goroutine's id (from its stack header): the
// watcher must know whether a cancel comes from inside one of its own
// callbacks, which it must not wait for.
func goid() uint64 {
	var buf [32]byte
	b := buf[:runtime.Stack(buf[:], false)]
	b = bytes.TrimPrefix(b, []byte("goroutine "))
	var id uint64
	for _, c := range b {
		if c < '0' || c > '9' {
			break
		}
		id = id*10 + uint64(c-'0')
	}
	return id
}

// waitDispatch waits until no callback runs, unless the caller is the
// goroutine running them (a callback cancelling or closing).
func (e *events) waitDispatch() {
	self := goid()
	e.dmu.Lock()
	defer e.dmu.Unlock()
	for e.dispatchBy != 0 && e.dispatchBy != self {
		e.dcond.Wait()
	}
}

// subscriber is what one subscription wants: the interface's changes
// (netdev), the port's state changes (port: true when the interface came
// up and running, false when it went down or lost its carrier), or both.
type subscriber struct {
	netdev func(driver.NetdevEvent)
	port   func(up bool)
}

// WatchNetdev calls fn for every change of the device's interface (removal,
// address added or removed) until cancel is called; when cancel returns fn
// is not running and is not called again (cancel from inside fn does not
// wait for itself). Callbacks run on one watcher goroutine, in order; the
// netlink subscription runs only while subscribers exist. If netlink is
// unavailable no event is ever delivered.
func (d *Device) WatchNetdev(fn func(driver.NetdevEvent)) (cancel func()) {
	return d.subscribe(subscriber{netdev: fn})
}

// subscribe adds a subscriber; cancel is WatchNetdev's.
func (d *Device) subscribe(sub subscriber) (cancel func()) {
	e := &d.ev
	e.mu.Lock()
	if e.subs == nil {
		e.subs = map[int]subscriber{}
	}
	id := e.nextID
	e.nextID++
	e.subs[id] = sub
	if e.done == nil {
		d.startWatcherLocked()
	}
	e.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			e.mu.Lock()
			delete(e.subs, id)
			var done, exited chan struct{}
			if len(e.subs) == 0 && e.done != nil {
				done, exited = e.done, e.exited
				e.done, e.exited = nil, nil
			}
			e.mu.Unlock()
			stopWatcher(e, done, exited)
			e.waitDispatch()
		})
	}
}

// stopEvents stops the watcher and forgets every subscriber (Close).
func (d *Device) stopEvents() {
	e := &d.ev
	e.mu.Lock()
	e.subs = nil
	done, exited := e.done, e.exited
	e.done, e.exited = nil, nil
	e.mu.Unlock()
	stopWatcher(e, done, exited)
	e.waitDispatch()
}

// stopWatcher closes done and waits for the watcher to exit, unless the
// caller is the one running callbacks (a callback cancelling or closing).
func stopWatcher(e *events, done, exited chan struct{}) {
	if done == nil {
		return
	}
	close(done)
	e.dmu.Lock()
	self := e.dispatchBy != 0 && e.dispatchBy == goid()
	e.dmu.Unlock()
	if !self {
		<-exited
	}
}

// startWatcherLocked subscribes to link and address changes.
func (d *Device) startWatcherLocked() {
	e := &d.ev
	done := make(chan struct{})
	exited := make(chan struct{})
	linkCh := make(chan netlink.LinkUpdate, 16)
	addrCh := make(chan netlink.AddrUpdate, 16)
	quiet := func(error) {}
	if err := netlink.LinkSubscribeWithOptions(linkCh, done, netlink.LinkSubscribeOptions{ErrorCallback: quiet}); err != nil {
		linkCh = nil
	}
	if err := netlink.AddrSubscribeWithOptions(addrCh, done, netlink.AddrSubscribeOptions{ErrorCallback: quiet}); err != nil {
		addrCh = nil
	}
	e.done, e.exited = done, exited
	e.live = linkCh != nil && addrCh != nil
	// Changes before the subscriptions started are not in the cache yet.
	info, _ := d.refreshInfo()
	e.linkUp = info.up
	go d.watch(done, exited, linkCh, addrCh)
}

// watch turns netlink updates of the device's interface into NetEvents
// until done is closed and the netlink channels are drained.
func (d *Device) watch(done, exited chan struct{}, linkCh chan netlink.LinkUpdate, addrCh chan netlink.AddrUpdate) {
	defer close(exited)
	doneCh := done
	for linkCh != nil || addrCh != nil || doneCh != nil {
		select {
		case <-doneCh:
			doneCh = nil
		case u, ok := <-linkCh:
			if !ok {
				linkCh = nil
				continue
			}
			if int(u.Index) != d.ifindex {
				continue
			}
			d.refreshInfo()
			if u.Header.Type == unix.RTM_DELLINK {
				d.emit(done, driver.NetdevEvent{Kind: driver.NetdevRemoved}, nil)
				continue
			}
			// The state this message carries, not the interface's
			// state now: a quick down and up gives both changes, in
			// order (the kernel's rxe_notify: NETDEV_UP, NETDEV_DOWN,
			// and NETDEV_CHANGE by the carrier).
			up := u.IfInfomsg.Flags&unix.IFF_UP != 0 && u.IfInfomsg.Flags&unix.IFF_RUNNING != 0
			d.ev.mu.Lock()
			changed := up != d.ev.linkUp
			d.ev.linkUp = up
			d.ev.mu.Unlock()
			if changed {
				d.emit(done, driver.NetdevEvent{}, &up)
			}
		case u, ok := <-addrCh:
			if !ok {
				addrCh = nil
				continue
			}
			if u.LinkIndex != d.ifindex {
				continue
			}
			d.refreshInfo()
			a, ok := netip.AddrFromSlice(u.LinkAddress.IP)
			if !ok {
				continue
			}
			k := driver.AddrRemoved
			if u.NewAddr {
				k = driver.AddrAdded
			}
			d.emit(done, driver.NetdevEvent{Kind: k, Addr: a.Unmap()}, nil)
		}
	}
}

// emit calls the current subscribers, unless the watcher is stopping:
// with the port's new state if up is not nil, else with ev.
func (d *Device) emit(done chan struct{}, ev driver.NetdevEvent, up *bool) {
	select {
	case <-done:
		return
	default:
	}
	e := &d.ev
	e.mu.Lock()
	ids := slices.Sorted(maps.Keys(e.subs))
	subs := make([]subscriber, len(ids))
	for i, id := range ids {
		subs[i] = e.subs[id]
	}
	// Marked as dispatching before e.mu is released: a cancel that
	// removes its subscriber after the snapshot waits for this dispatch.
	e.dmu.Lock()
	if e.dcond == nil {
		e.dcond = sync.NewCond(&e.dmu)
	}
	e.dispatchBy = goid()
	e.dmu.Unlock()
	e.mu.Unlock()
	defer func() {
		e.dmu.Lock()
		e.dispatchBy = 0
		e.dcond.Broadcast()
		e.dmu.Unlock()
	}()
	for _, s := range subs {
		switch {
		case up != nil && s.port != nil:
			s.port(*up)
		case up == nil && s.netdev != nil:
			s.netdev(ev)
		}
	}
}

// Subscribe reports the interface's changes as device events
// (driver.EventSource, through the verbs core), for operator tools.
func (d *Device) Subscribe(fn func(verbs.DeviceEvent)) (cancel func()) {
	return d.WatchNetdev(func(ev driver.NetdevEvent) { fn(verbs.DeviceEvent{Kind: ev.Kind.String(), Addr: ev.Addr}) })
}
