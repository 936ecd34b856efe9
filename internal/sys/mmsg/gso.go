package mmsg

import (
	"net/netip"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// UDP generic segmentation offload (UDP_SEGMENT, Linux 4.18): one send of
// several datagrams of one length to one destination, which the kernel
// splits into datagrams late (on loopback, at the receiving socket). It
// costs a fraction of sending the datagrams one by one.

// MaxSegments is the most datagrams one GSO send carries (the kernel's
// UDP_MAX_SEGMENTS of Linux 4.18; later kernels allow more).
const MaxSegments = 64

// maxGSOBytes bounds the bytes of one GSO send (an IPv4 datagram's 65,507
// bytes of payload, with room to spare).
const maxGSOBytes = 65000

// segOOBLen is the space of a UDP_SEGMENT control message (a uint16).
var segOOBLen = unix.CmsgSpace(2)

// GSOSupported reports whether the kernel takes UDP_SEGMENT on conn's
// socket.
func GSOSupported(raw syscall.RawConn) bool {
	ok := false
	raw.Control(func(fd uintptr) {
		_, err := unix.GetsockoptInt(int(fd), unix.IPPROTO_UDP, unix.UDP_SEGMENT)
		ok = err == nil
	})
	return ok
}

// GSOBatch lays datagrams out for sendmmsg: consecutive datagrams of one
// length to one destination become one GSO message when GSO is on, each
// other datagram a message of its own. Its memory is allocated once.
type GSOBatch struct {
	// GSO turns coalescing on.
	GSO bool

	hs    []unix.Mmsghdr
	iovs  []unix.Iovec
	names [][unix.SizeofSockaddrInet6]byte
	oobs  []byte
	segs  []int // datagrams of each message
	bufs  [][]byte
	last  netip.AddrPort
	solo  bool // the last message takes no more datagrams
	bytes int  // of the last message
	n, k  int  // messages, datagrams
	snd   Sender
}

// NewGSOBatch returns a batch of up to n datagrams.
func NewGSOBatch(n int) *GSOBatch {
	b := &GSOBatch{hs: make([]unix.Mmsghdr, n), iovs: make([]unix.Iovec, n), names: make([][unix.SizeofSockaddrInet6]byte, n),
		oobs: make([]byte, n*segOOBLen), segs: make([]int, n), bufs: make([][]byte, n)}
	b.snd.Init()
	return b
}

// Len returns the number of datagrams staged.
func (b *GSOBatch) Len() int { return b.k }

// Full reports whether the batch takes no more datagrams.
func (b *GSOBatch) Full() bool { return b.k == len(b.iovs) }

// Add stages datagram p (not empty; it must stay unchanged until Send) for
// to; alone keeps it out of any GSO message.
func (b *GSOBatch) Add(p []byte, to netip.AddrPort, alone bool) {
	i := b.k
	b.k++
	b.bufs[i] = p
	b.iovs[i].Base = &p[0]
	b.iovs[i].SetLen(len(p))
	if b.n > 0 && b.GSO && !alone && !b.solo && to == b.last {
		m := b.n - 1
		first := len(b.bufs[i-b.segs[m]])
		if len(p) == first && b.segs[m] < MaxSegments && b.bytes+len(p) <= maxGSOBytes {
			b.segs[m]++
			b.bytes += len(p)
			b.hs[m].Hdr.SetIovlen(b.segs[m])
			return
		}
	}
	m := b.n
	b.n++
	h := &b.hs[m].Hdr
	*h = unix.Msghdr{Iov: &b.iovs[i], Name: &b.names[m][0]}
	h.SetIovlen(1)
	h.Namelen = PutAddrPort(b.names[m][:], to)
	b.segs[m], b.bytes, b.last, b.solo = 1, len(p), to, alone
}

// Send sends the staged datagrams with sendmmsg calls and empties the
// batch. It returns how many datagrams the kernel refused (each refused
// message's) and err when the socket failed (closed): the rest is not
// sent.
func (b *GSOBatch) Send(raw syscall.RawConn) (refused int, err error) {
	for m := range b.n {
		h := &b.hs[m].Hdr
		if b.segs[m] > 1 {
			oob := b.oobs[m*segOOBLen : (m+1)*segOOBLen]
			c := (*unix.Cmsghdr)(unsafe.Pointer(&oob[0]))
			c.Level, c.Type = unix.SOL_UDP, unix.UDP_SEGMENT
			c.SetLen(unix.CmsgLen(2))
			*(*uint16)(unsafe.Pointer(&oob[unix.CmsgLen(0)])) = uint16(b.iovs[b.first(m)].Len)
			h.Control = &oob[0]
			h.SetControllen(segOOBLen)
		} else {
			h.Control = nil
			h.SetControllen(0)
		}
	}
	for off := 0; off < b.n && err == nil; {
		var n int
		var errno syscall.Errno
		n, errno, err = b.snd.Send(raw, b.hs[off:b.n])
		if err != nil {
			break
		}
		if errno != 0 {
			refused += b.segs[off]
			n = 1
		}
		off += n
	}
	clear(b.bufs[:b.k])
	b.n, b.k, b.bytes, b.solo, b.last = 0, 0, 0, false, netip.AddrPort{}
	return refused, err
}

// first returns the index of message m's first datagram.
func (b *GSOBatch) first(m int) int {
	i := 0
	for j := range m {
		i += b.segs[j]
	}
	return i
}
