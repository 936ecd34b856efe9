package mmsg

import (
	"net"
	"net/netip"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// pair opens a receiving and a sending socket on 127.0.0.1 and returns
// them with the receiver's address.
func pair(t *testing.T) (rc, sc *net.UDPConn) {
	t.Helper()
	rc, err := ListenUDP("udp4", "127.0.0.1:0", func(fd int) error {
		return unix.SetsockoptInt(fd, unix.IPPROTO_IP, unix.IP_PKTINFO, 1)
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rc.Close() })
	sc, err = ListenUDP("udp4", "127.0.0.1:0", func(int) error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sc.Close() })
	rc.SetReadDeadline(time.Now().Add(10 * time.Second))
	return rc, sc
}

// sendBatch prepares a batch of n datagrams of size bytes to to.
func sendBatch(n, size int, to *net.UDPAddr) (*Batch, *unix.RawSockaddrInet4) {
	b := NewBatch(n, size, 0, 0)
	sa := &unix.RawSockaddrInet4{Family: unix.AF_INET, Addr: [4]byte{127, 0, 0, 1}}
	p := (*[2]byte)(unsafe.Pointer(&sa.Port))
	p[0], p[1] = byte(to.Port>>8), byte(to.Port)
	for i := range b.Hdrs {
		buf := b.Buf(i)
		for k := range buf {
			buf[k] = byte(i)
		}
		b.Hdrs[i].Hdr.Name = (*byte)(unsafe.Pointer(sa))
		b.Hdrs[i].Hdr.Namelen = unix.SizeofSockaddrInet4
	}
	return b, sa
}

func TestRoundTrip(t *testing.T) {
	for _, pooled := range []bool{false, true} {
		rc, sc := pair(t)
		var r *Reader
		var err error
		if pooled {
			r, err = NewPooledReader(rc, NewPool(func() *Batch { return NewBatch(4, 2048, unix.SizeofSockaddrInet6, 64) }))
		} else {
			r, err = NewReader(rc, NewBatch(4, 2048, unix.SizeofSockaddrInet6, 64))
		}
		if err != nil {
			t.Fatal(err)
		}
		const n, size = 6, 100
		b, _ := sendBatch(n, size, rc.LocalAddr().(*net.UDPAddr))
		raw, err := sc.SyscallConn()
		if err != nil {
			t.Fatal(err)
		}
		s := NewSender()
		for off := 0; off < n; {
			k, errno, err := s.Send(raw, b.Hdrs[off:])
			if err != nil || errno != 0 {
				t.Fatal(err, errno)
			}
			off += k
		}
		got := 0
		for got < n {
			k, err := r.Read()
			if err != nil {
				t.Fatal(err)
			}
			for i := range k {
				d, name, oob, trunc := r.Datagram(i)
				if len(d) != size || d[0] != byte(got+i) || trunc {
					t.Fatalf("datagram %d: len %d first %d trunc %v", got+i, len(d), d[0], trunc)
				}
				if len(name) != unix.SizeofSockaddrInet4 || len(oob) == 0 {
					t.Fatalf("datagram %d: name %d bytes, oob %d bytes", got+i, len(name), len(oob))
				}
			}
			got += k
		}
		r.Release()
	}
}

func TestTruncated(t *testing.T) {
	rc, sc := pair(t)
	r, err := NewReader(rc, NewBatch(2, 16, 0, 0))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sc.WriteTo(make([]byte, 64), rc.LocalAddr()); err != nil {
		t.Fatal(err)
	}
	if k, err := r.Read(); err != nil || k != 1 {
		t.Fatal(k, err)
	}
	if d, name, oob, trunc := r.Datagram(0); len(d) != 16 || len(name) != 0 || len(oob) != 0 || !trunc {
		t.Fatalf("got %d bytes, name %d, oob %d, trunc %v", len(d), len(name), len(oob), trunc)
	}
}

func TestAllocs(t *testing.T) {
	rc, sc := pair(t)
	r, err := NewPooledReader(rc, NewPool(func() *Batch { return NewBatch(4, 2048, unix.SizeofSockaddrInet6, 64) }))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := sendBatch(4, 64, rc.LocalAddr().(*net.UDPAddr))
	raw, err := sc.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	s := NewSender()
	// Warm the pool and the netpoller registration.
	round := func() {
		for off := 0; off < len(b.Hdrs); {
			k, errno, err := s.Send(raw, b.Hdrs[off:])
			if err != nil || errno != 0 {
				t.Fatal(err, errno)
			}
			off += k
		}
		for got := 0; got < len(b.Hdrs); {
			k, err := r.Read()
			if err != nil {
				t.Fatal(err)
			}
			got += k
		}
	}
	round()
	if a := testing.AllocsPerRun(100, round); a != 0 {
		t.Errorf("%v allocs per batch, want 0", a)
	}
}

func TestAddrPort(t *testing.T) {
	var name [unix.SizeofSockaddrInet6]byte
	for _, s := range []string{"127.0.0.1:4792", "[::1]:9", "[fe80::1]:65535"} {
		a := netip.MustParseAddrPort(s)
		n := PutAddrPort(name[:], a)
		if got := AddrPort(name[:n]); got != a {
			t.Errorf("%v: round trip gives %v", a, got)
		}
	}
	if got := AddrPort([]byte{1}); got.IsValid() {
		t.Errorf("short name: %v", got)
	}
}

// TestGSOBatch: datagrams staged in a GSOBatch arrive one by one, whole
// and in order, with GSO on (runs of one length to one address become one
// send) and off.
func TestGSOBatch(t *testing.T) {
	r, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	s, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	raw, err := s.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	to := r.LocalAddr().(*net.UDPAddr).AddrPort()
	for _, gso := range []bool{false, true} {
		if gso && !GSOSupported(raw) {
			t.Log("no UDP_SEGMENT on this kernel")
			continue
		}
		b := NewGSOBatch(100)
		b.GSO = gso
		var want [][]byte
		add := func(n int, alone bool) {
			p := make([]byte, n)
			for i := range p {
				p[i] = byte(len(want) + i)
			}
			want = append(want, p)
			b.Add(p, to, alone)
		}
		for range 70 { // more than MaxSegments of one length
			add(100, false)
		}
		add(6, true)
		add(6, true)
		add(50, false)
		add(100, false)
		add(100, false)
		if refused, err := b.Send(raw); refused != 0 || err != nil {
			t.Fatalf("gso %v: refused %d, %v", gso, refused, err)
		}
		buf := make([]byte, 65536)
		r.SetReadDeadline(time.Now().Add(5 * time.Second))
		for i, w := range want {
			n, err := r.Read(buf)
			if err != nil {
				t.Fatalf("gso %v: datagram %d: %v", gso, i, err)
			}
			if string(buf[:n]) != string(w) {
				t.Fatalf("gso %v: datagram %d: %d bytes, want %d", gso, i, n, len(w))
			}
		}
	}
}

// TestServe: Serve hands over every datagram, in order, when batches come
// full and when they come short (after which it waits in the netpoller
// without a read of its own: the next round's datagrams must wake it), for
// a reader with its own batch and a pooled one, and returns when the
// socket is closed.
func TestServe(t *testing.T) {
	for _, pooled := range []bool{false, true} {
		rc, sc := pair(t)
		newBatch := func() *Batch { return NewBatch(4, 256, unix.SizeofSockaddrInet6, 64) }
		var r *Reader
		var err error
		if pooled {
			r, err = NewPooledReader(rc, NewPool(newBatch))
		} else {
			r, err = NewReader(rc, newBatch())
		}
		if err != nil {
			t.Fatal(err)
		}
		got := make(chan byte, 64)
		done := make(chan error, 1)
		go func() {
			done <- r.Serve(func(n int) {
				if n < 1 || n > 4 {
					t.Errorf("batch of %d", n)
				}
				for i := range n {
					d, _, _, _ := r.Datagram(i)
					got <- d[0]
				}
			})
		}()
		raw, err := sc.SyscallConn()
		if err != nil {
			t.Fatal(err)
		}
		s := NewSender()
		next := byte(0)
		for _, k := range []int{6, 1, 4, 3, 8, 2, 5} {
			b, _ := sendBatch(k, 32, rc.LocalAddr().(*net.UDPAddr))
			for i := range k {
				b.Buf(i)[0] = next + byte(i)
			}
			for off := 0; off < k; {
				m, errno, err := s.Send(raw, b.Hdrs[off:])
				if err != nil || errno != 0 {
					t.Fatal(err, errno)
				}
				off += m
			}
			// Wait for the whole round before sending the next one, so
			// that the reader has seen a short batch and waits.
			for range k {
				select {
				case v := <-got:
					if v != next {
						t.Fatalf("pooled=%v: datagram %d, want %d", pooled, v, next)
					}
					next++
				case <-time.After(10 * time.Second):
					t.Fatalf("pooled=%v: datagram %d never handed over", pooled, next)
				}
			}
		}
		rc.Close()
		select {
		case err := <-done:
			if err == nil {
				t.Fatalf("pooled=%v: Serve returned nil after close", pooled)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("pooled=%v: Serve did not return after close", pooled)
		}
	}
}
