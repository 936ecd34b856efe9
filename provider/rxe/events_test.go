package rxe

import (
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/softrdma/softrdma/test/testenv"
	"github.com/softrdma/softrdma/verbs"
	"github.com/softrdma/softrdma/verbs/driver"
	"github.com/softrdma/softrdma/wire"
)

// TestNetEvents creates a veth pair (root only; its traffic stays between
// its two ends), subscribes to its device's events and adds and removes
// an address and then the interface.
func TestNetEvents(t *testing.T) {
	if os.Geteuid() != 0 {
		testenv.Require(t, "creating a veth pair needs root")
	}
	name := fmt.Sprintf("srxd%06x", rand.IntN(1<<24))
	la := netlink.NewLinkAttrs()
	la.Name = name
	if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: la, PeerName: name + "p"}); err != nil {
		testenv.Require(t, "cannot create a veth pair: %v", err)
	}
	link, err := netlink.LinkByName(name)
	if err != nil {
		t.Fatal(err)
	}
	deleted := false
	defer func() {
		if !deleted {
			netlink.LinkDel(link)
		}
	}()
	peer, err := netlink.LinkByName(name + "p")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range []netlink.Link{link, peer} {
		if err := netlink.LinkSetUp(l); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "veth running", func() bool {
		i, err := net.InterfaceByName(name)
		return err == nil && i.Flags&net.FlagRunning != 0
	})
	d, err := ForName(name)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if d.Name() != "rxe_"+name {
		t.Errorf("name %q", d.Name())
	}
	evs := make(chan driver.NetdevEvent, 64)
	cancel := d.WatchNetdev(func(e driver.NetdevEvent) { evs <- e })
	defer cancel()
	// A second subscriber, cancelled at once, does not stop the first.
	d.WatchNetdev(func(driver.NetdevEvent) {})()

	expect := func(kind driver.NetdevEventKind, addr netip.Addr) {
		t.Helper()
		timeout := time.After(5 * time.Second)
		for {
			select {
			case e := <-evs:
				if e.Kind == kind && e.Addr == addr {
					return
				}
			case <-timeout:
				t.Fatalf("no %v %v event", kind, addr)
			}
		}
	}
	addr := netip.AddrFrom4([4]byte{198, 18, byte(rand.IntN(256)), byte(1 + rand.IntN(254))})
	nlAddr := &netlink.Addr{IPNet: &net.IPNet{IP: addr.AsSlice(), Mask: net.CIDRMask(32, 32)}}
	if err := netlink.AddrAdd(link, nlAddr); err != nil {
		t.Fatal(err)
	}
	expect(driver.AddrAdded, addr)
	tbl, err := d.GIDTable(1)
	if err != nil || len(tbl) == 0 || tbl[0].GID != wire.GIDFromAddr(addr) || tbl[0].NetdevIdx != link.Attrs().Index {
		t.Errorf("gid table %+v %v", tbl, err)
	}
	if pa, _ := d.QueryPort(1); pa.State != verbs.PortActive || pa.NetdevMTU != 1500 || pa.ActiveMTU != verbs.MTU1024 {
		t.Errorf("port %+v", pa)
	}
	if d2, err := ForAddr(addr); err != nil || d2 != d {
		t.Errorf("ForAddr %v: %v", addr, err)
	}
	if err := netlink.AddrDel(link, nlAddr); err != nil {
		t.Fatal(err)
	}
	expect(driver.AddrRemoved, addr)
	if err := netlink.LinkDel(link); err != nil {
		t.Fatal(err)
	}
	deleted = true
	expect(driver.NetdevRemoved, netip.Addr{})
	if pa, _ := d.QueryPort(1); pa.State != verbs.PortDown {
		t.Errorf("port of a removed interface %v", pa.State)
	}
}

// TestCancelWaitsForCallback: cancel does not return while the callback
// runs (on the watcher), and a callback that cancels itself does not
// wait for itself.
func TestCancelWaitsForCallback(t *testing.T) {
	d := loDev(t)
	entered, release := make(chan struct{}), make(chan struct{})
	var finished atomic.Bool
	cancel := d.WatchNetdev(func(driver.NetdevEvent) {
		close(entered)
		<-release
		finished.Store(true)
	})
	d.ev.mu.Lock()
	done := d.ev.done
	d.ev.mu.Unlock()
	go d.emit(done, driver.NetdevEvent{Kind: driver.AddrAdded}, nil)
	<-entered
	stopped := make(chan struct{})
	go func() { cancel(); close(stopped) }()
	select {
	case <-stopped:
		t.Fatal("cancel returned while the callback runs")
	case <-time.After(50 * time.Millisecond):
	}
	close(release)
	<-stopped
	if !finished.Load() {
		t.Fatal("cancel returned before the callback finished")
	}

	// A callback cancelling itself returns.
	var self func()
	returned := make(chan struct{})
	self = d.WatchNetdev(func(driver.NetdevEvent) { self(); close(returned) })
	d.ev.mu.Lock()
	done = d.ev.done
	d.ev.mu.Unlock()
	go d.emit(done, driver.NetdevEvent{Kind: driver.AddrAdded}, nil)
	select {
	case <-returned:
	case <-time.After(5 * time.Second):
		t.Fatal("a callback cancelling itself hangs")
	}
}
