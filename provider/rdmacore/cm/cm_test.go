//go:build rdmacore && cgo

package cm

import (
	"errors"
	"sync"
	"syscall"
	"testing"

	"go.uber.org/goleak"
	"golang.org/x/sys/unix"
)

// These tests need the kernel's RDMA CM (/dev/infiniband/rdma_cm): they
// skip without it. test/interop's TestKernelVerbs runs them in a QEMU
// guest.

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func newChannel(t *testing.T) *CMChannel {
	t.Helper()
	c, err := NewCMChannel()
	if err != nil {
		t.Skipf("no kernel RDMA CM (rdma_create_event_channel: %v): test/interop's TestKernelVerbs runs this test in a guest", err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// TestIDAfterDestroy destroys an id while other goroutines call it: the
// calls in progress end first, later ones fail with EINVAL or return
// nothing, and none touches the freed librdmacm id (meant for -race). A
// second Destroy is EINVAL.
func TestIDAfterDestroy(t *testing.T) {
	c := newChannel(t)
	any4 := make([]byte, unix.SizeofSockaddrInet4)
	any4[0] = unix.AF_INET // struct sockaddr_in, little-endian family
	for round := range 20 {
		id, err := c.CreateID(uint64(round), psUDP)
		if err != nil {
			t.Fatal(err)
		}
		if err := id.Bind(any4); err != nil {
			t.Fatalf("bind 0.0.0.0: %v", err)
		}
		start := make(chan struct{})
		var wg sync.WaitGroup
		for range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				for range 200 {
					id.LocalAddr()
					id.SrcPort()
					id.DeviceName()
					id.PortNum()
					_ = id.SetOption(0, 0, nil)
				}
			}()
		}
		close(start)
		if err := id.Destroy(); err != nil {
			t.Fatalf("round %d: destroy: %v", round, err)
		}
		wg.Wait()
		if err := id.Bind(any4); !errors.Is(err, syscall.EINVAL) {
			t.Errorf("bind after destroy: %v, want EINVAL", err)
		}
		if err := id.ResolveRoute(100); !errors.Is(err, syscall.EINVAL) {
			t.Errorf("resolve route after destroy: %v, want EINVAL", err)
		}
		if a, p := id.LocalAddr(), id.SrcPort(); len(a) != 0 || p != 0 {
			t.Errorf("after destroy: local address % x, port %d", a, p)
		}
		if err := id.Destroy(); !errors.Is(err, syscall.EINVAL) {
			t.Errorf("second destroy: %v, want EINVAL", err)
		}
	}
}
