// Package mmsg does batched datagram I/O on UDP sockets: recvmmsg(2) and
// sendmmsg(2) called through syscall.RawConn, so that a goroutine waiting
// for a socket parks in the runtime's netpoller instead of blocking a
// thread in the kernel.
//
// It is the one implementation of batching shared by the rxe provider's
// sockets and the plain-UDP baseline of the benchmark, so that the two
// batch alike. The wrappers are thin, in the manner of
// golang.org/x/net/ipv4's batch I/O and gVisor's rawfile: the caller's
// buffers, message headers and iovecs are set up once (Batch), and a read
// or a send allocates nothing per datagram.
//
// Linux only.
package mmsg

import (
	"context"
	"encoding/binary"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/softrdma/softrdma/internal/sys/pollfd"
	"golang.org/x/sys/unix"
)

// ListenUDP opens a UDP socket of network "udp4" or "udp6" bound to addr,
// running setup on the descriptor before bind (to set socket options).
func ListenUDP(network, addr string, setup func(fd int) error) (*net.UDPConn, error) {
	lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		if err := c.Control(func(fd uintptr) { serr = setup(int(fd)) }); err != nil {
			return err
		}
		return serr
	}}
	pc, err := lc.ListenPacket(context.Background(), network, addr)
	if err != nil {
		return nil, err
	}
	return pc.(*net.UDPConn), nil
}

// Batch is the memory of one recvmmsg or sendmmsg call: N message headers,
// each with one iovec over its own data buffer and, optionally, its own
// address (msg_name) and control message (msg_control) buffers. All of it
// is allocated once, by NewBatch.
type Batch struct {
	// Hdrs are the message headers, one per datagram; Hdrs[i] points at
	// the i-th iovec, name and control buffer.
	Hdrs []unix.Mmsghdr

	iovs    []unix.Iovec
	data    []byte
	names   []byte
	oobs    []byte
	bufLen  int
	nameLen int
	oobLen  int
}

// NewBatch allocates a batch of n datagrams of up to bufLen bytes each.
// nameLen is the size of each address buffer (e.g.
// unix.SizeofSockaddrInet6) and oobLen of each control buffer; 0 means
// none (msg_name or msg_control nil).
func NewBatch(n, bufLen, nameLen, oobLen int) *Batch {
	b := &Batch{}
	b.Init(make([]unix.Mmsghdr, n), make([]unix.Iovec, n), make([]byte, n*bufLen),
		make([]byte, n*nameLen), make([]byte, n*oobLen))
	return b
}

// Init lays the batch over memory the caller provides, so that it can be
// one allocation with the batch (see Pool): len(hs) > 0 datagrams, with one
// iovec each in iovs, and data, names and oobs split evenly among them
// (names or oobs may be empty: none). Each control buffer should be a
// multiple of 8 bytes and oobs 8-byte aligned, as control messages are
// read through *unix.Cmsghdr.
func (b *Batch) Init(hs []unix.Mmsghdr, iovs []unix.Iovec, data, names, oobs []byte) {
	n := len(hs)
	*b = Batch{Hdrs: hs, iovs: iovs[:n], data: data, names: names, oobs: oobs,
		bufLen: len(data) / n, nameLen: len(names) / n, oobLen: len(oobs) / n}
	for i := range hs {
		h := &hs[i].Hdr
		*h = unix.Msghdr{}
		if b.bufLen > 0 {
			b.iovs[i].Base = &data[i*b.bufLen]
			b.iovs[i].SetLen(b.bufLen)
		}
		h.Iov = &b.iovs[i]
		h.SetIovlen(1)
		if b.nameLen > 0 {
			h.Name = &names[i*b.nameLen]
			h.Namelen = uint32(b.nameLen)
		}
		if b.oobLen > 0 {
			h.Control = &oobs[i*b.oobLen]
			h.SetControllen(b.oobLen)
		}
	}
}

// Buf returns the whole data buffer of the i-th datagram (bufLen bytes),
// to fill before a send.
func (b *Batch) Buf(i int) []byte { return b.data[i*b.bufLen : (i+1)*b.bufLen] }

// reset readies the headers for a receive: full name and control buffer
// lengths, no flags, no length.
func (b *Batch) reset() {
	for i := range b.Hdrs {
		h := &b.Hdrs[i].Hdr
		h.Namelen = uint32(b.nameLen)
		h.SetControllen(b.oobLen)
		h.Flags = 0
		b.Hdrs[i].Len = 0
	}
}

// Datagram returns the i-th datagram received into the batch: its bytes,
// raw source address (a unix.RawSockaddrInet4/6), control messages and
// whether the kernel truncated it (MSG_TRUNC).
func (b *Batch) Datagram(i int) (data, name, oob []byte, trunc bool) {
	h := &b.Hdrs[i].Hdr
	n := int(b.Hdrs[i].Len)
	nn := min(int(h.Controllen), b.oobLen)
	nl := min(int(h.Namelen), b.nameLen)
	off := i * b.bufLen
	return b.data[off : off+n], b.names[i*b.nameLen : i*b.nameLen+nl],
		b.oobs[i*b.oobLen : i*b.oobLen+nn], h.Flags&unix.MSG_TRUNC != 0
}

// Pool is a pool of batches of one shape, for readers of idle sockets to
// hold no buffers.
type Pool struct{ p sync.Pool }

// NewPool returns a pool whose batches newBatch makes. A batch made in one
// allocation (Batch.Init over arrays of the same struct) keeps the pool's
// refills to one allocation.
func NewPool(newBatch func() *Batch) *Pool {
	p := &Pool{}
	p.p.New = func() any { return newBatch() }
	return p
}

// Get takes a batch from the pool.
func (p *Pool) Get() *Batch { return p.p.Get().(*Batch) }

// Put gives a batch back to the pool.
func (p *Pool) Put(b *Batch) { p.p.Put(b) }

// Reader reads batches of datagrams from one socket with recvmmsg. Read
// is used by one goroutine at a time; Serve by one, and Progress and
// Wait by any while it serves.
type Reader struct {
	raw  syscall.RawConn
	pool *Pool  // nil: b is the reader's own
	b    *Batch // nil while idle (pooled reader)

	n     int
	errno syscall.Errno
	fn    func(fd uintptr) bool // r.recvmmsg, bound once

	endOnEmpty bool // an empty read is the end of the connection (EndOnEmpty)
	eof        bool // the batch read last ended at the end of the connection

	asyncErrs atomic.Uint64             // errors reported for ICMP messages, read on (AsyncErrors)
	onAsync   func(errno syscall.Errno) // OnAsyncError's function, if any

	serveFn    func(fd uintptr) bool // r.serveBatches, bound once
	progressFn func(fd uintptr)      // r.progress, bound once

	// Serve's state, shared with Progress: whoever holds mu reads the
	// socket and runs the handler.
	mu       sync.Mutex
	serve    func(n int)   // Serve's handler, while it runs
	byServe  bool          // the handler runs on Serve's goroutine (r.mu held)
	pending  atomic.Bool   // a goroutine found mu held: its holder reads on
	fatal    atomic.Uint32 // the errno that ends Serve
	sleepers atomic.Int32  // goroutines in Wait
	pauser   readPauser    // the socket, if it can leave the netpoller

	uses   atomic.Uint64 // Progress calls and ended Waits: the lease's clock
	paused atomic.Bool   // the socket is out of the netpoller (set under pmu)

	// Wait's blocking receive (blocking.go), for one waiter at a time:
	// the one holding mu.
	noBlock  atomic.Bool    // the socket cannot block: waiters ppoll
	blocking bool           // its O_NONBLOCK is cleared (mu held)
	rcvtimeo time.Duration  // its SO_RCVTIMEO; 0: to set (mu held)
	sl       pollfd.Sleeper // the blocked waiter, for its Kick (mu held)

	pmu     sync.Mutex  // orders the changes of read interest, and the lease
	lease   *time.Timer // puts the socket back (leaseOver)
	seen    uint64      // uses at the lease's last look
	stopped bool        // Serve returned: no more lease
}

// NewReader returns a reader of conn (a *net.UDPConn or a *rawudp.Conn)
// into b, which it keeps.
func NewReader(conn syscall.Conn, b *Batch) (*Reader, error) {
	return newReader(conn, nil, b)
}

// NewPooledReader returns a reader of conn whose batch comes from p and
// goes back to it whenever the socket has nothing to read, so that an idle
// socket holds no buffers; under load the reader keeps its batch.
func NewPooledReader(conn syscall.Conn, p *Pool) (*Reader, error) {
	return newReader(conn, p, nil)
}

func newReader(conn syscall.Conn, p *Pool, b *Batch) (*Reader, error) {
	raw, err := conn.SyscallConn()
	if err != nil {
		return nil, err
	}
	r := &Reader{raw: raw, pool: p, b: b}
	r.pauser, _ = conn.(readPauser)
	r.fn = r.recvmmsg
	r.serveFn = r.serveBatches
	// A consumer reads one batch a call where the lease guarantees that
	// the rest is read (it polls again, or Serve reads it when the lease
	// ends), so that it reposts its receive WRs between batches as it
	// would between Serve's; else until the socket is empty.
	r.progressFn = func(fd uintptr) { r.progress(fd, r.pauser != nil, false) }
	return r, nil
}

// recvmmsg is the RawConn.Read callback: one non-blocking recvmmsg;
// false (wait in the netpoller) when there is nothing to read.
//
// It is a raw system call (no entersyscall): with MSG_DONTWAIT it never
// blocks, and a Syscall would wake the runtime's sysmon thread whenever it
// sleeps, which it does each time the process has been idle — for a
// receiver that waits in the netpoller between bursts, a futex wake-up and
// a few sysmon rounds every wake-up (0.1–0.2 µs per datagram in the
// bench's receivers).
func (r *Reader) recvmmsg(fd uintptr) bool {
	b := r.batch()
	n, _, e := unix.RawSyscall6(unix.SYS_RECVMMSG, fd, uintptr(unsafe.Pointer(&b.Hdrs[0])),
		uintptr(len(b.Hdrs)), unix.MSG_DONTWAIT, 0, 0)
	if e == unix.EAGAIN {
		if r.pool != nil {
			r.pool.Put(b)
			r.b = nil
		}
		return false
	}
	r.n, r.errno = int(n), e
	if e != 0 {
		r.n = 0
	} else if r.endOnEmpty {
		r.cutAtEnd(b)
	}
	return true
}

// batch returns the batch to read into next, reset (r.mu held): the
// reader's own, or one from the pool.
func (r *Reader) batch() *Batch {
	if r.b == nil {
		r.b = r.pool.Get()
	}
	r.b.reset()
	return r.b
}

// EndOnEmpty makes the reader of a connected SOCK_SEQPACKET socket take an
// empty read for the end of the connection (recvmmsg then returns a
// zero-length message, again on every call): Read and Serve end with
// ECONNRESET once the datagrams before it are handled. Call it before
// Serve; on a UDP socket, where a datagram may be empty, never.
func (r *Reader) EndOnEmpty() { r.endOnEmpty = true }

// OnAsyncError makes the reader call fn with each error it reads on
// (AsyncError), for its owner to count or log; fn runs where the read
// ran (Serve's handler's goroutine, or Read's caller) and must not use
// the Reader. Call it before Read or Serve.
func (r *Reader) OnAsyncError(fn func(errno syscall.Errno)) { r.onAsync = fn }

// AsyncErrors returns how many errors the reader read on (AsyncError).
func (r *Reader) AsyncErrors() uint64 { return r.asyncErrs.Load() }

// async reports whether errno, returned by a read, is an asynchronous
// error of a datagram socket that the reader reads on, and counts it.
func (r *Reader) async(errno syscall.Errno) bool {
	if r.endOnEmpty || !AsyncError(errno) {
		return false
	}
	r.asyncErrs.Add(1)
	if r.onAsync != nil {
		r.onAsync(errno)
	}
	return true
}

// AsyncError reports whether errno, returned by a receive (or a send) on
// a UDP socket, is an error the kernel keeps for an ICMP or ICMPv6 error
// message about a datagram (destination, port or protocol unreachable,
// packet too big, parameter problem, time exceeded, administratively
// prohibited; see icmp_err_convert and icmpv6_err_convert) rather than a
// failure of the socket. The kernel keeps one such error per socket (a
// connected one, or one with IP_RECVERR) and hands it to the next receive
// or send, which it fails, and clears it: the datagrams queued behind it,
// and the socket, are untouched. Anyone who can send ICMP to the host
// can make one, quoting the socket's addresses and ports, so a reader
// takes it for news, never for the socket's end.
func AsyncError(errno syscall.Errno) bool {
	switch errno {
	case unix.ECONNREFUSED, unix.EHOSTUNREACH, unix.ENETUNREACH, unix.EHOSTDOWN, unix.ENETDOWN,
		unix.ENONET, unix.ENOPROTOOPT, unix.EPROTO, unix.EOPNOTSUPP, unix.EMSGSIZE, unix.EACCES,
		unix.ETIMEDOUT:
		return true
	}
	return false
}

// cutAtEnd cuts the batch just read at its first empty message (the end of
// the connection): the end itself when it comes first, else after the
// datagrams before it (r.eof).
func (r *Reader) cutAtEnd(b *Batch) {
	for i := 0; i < r.n; i++ {
		if b.Hdrs[i].Len == 0 {
			r.n = i
			if i == 0 {
				r.errno = unix.ECONNRESET
			} else {
				r.eof = true
			}
			return
		}
	}
}

// Read blocks until at least one datagram is read and returns how many.
// EINTR, ENOMEM and ENOBUFS are retried, and so are the errors the kernel
// reports for ICMP messages (AsyncError: counted, see AsyncErrors); an
// error means the socket was closed (or failed for good). The datagrams (Datagram) stay valid until
// the next Read or Release.
func (r *Reader) Read() (int, error) {
	for {
		if err := r.raw.Read(r.fn); err != nil {
			r.Release()
			return 0, err
		}
		switch r.errno {
		case 0:
			if r.n > 0 {
				r.eof = false // the next read finds the end again
				return r.n, nil
			}
		case unix.EINTR, unix.ENOMEM, unix.ENOBUFS:
			// transient
		default:
			if r.async(r.errno) {
				continue
			}
			r.Release()
			return 0, r.errno
		}
	}
}

// Serve reads batches until the socket is closed (or fails for good, as
// Read), calling handle with the number of datagrams of each batch, which
// it reads with Datagram (valid until handle returns). Unlike a loop of
// Reads it makes no recvmmsg that would find the socket empty: a batch
// shorter than the batch size emptied the receive queue, so Serve waits
// in the netpoller right away, whose edge-triggered readiness every
// datagram queued after that read sets — one system call per batch fewer.
// A pooled reader gives its batch back before each wait. handle runs on
// the calling goroutine, or on a goroutine in Progress, one at a time, and
// must not use the Reader; it runs inside the socket's RawConn.Read
// callback, so closing the socket waits for it: handle must not wait for
// anything that happens only after the close.
func (r *Reader) Serve(handle func(n int)) error {
	r.mu.Lock()
	r.serve = handle
	r.mu.Unlock()
	defer func() {
		r.stopLease()
		r.mu.Lock()
		r.serve = nil
		r.Release()
		r.mu.Unlock()
	}()
	for {
		// One RawConn.Read for as long as the socket works: its
		// readiness is reset only here, at the start.
		if err := r.raw.Read(r.serveFn); err != nil {
			return err
		}
		if e := syscall.Errno(r.fatal.Load()); e != 0 {
			return e
		}
	}
}

// serveBatches is Serve's RawConn.Read callback: it reads and hands over
// batches until the socket is empty (or another goroutine is reading it);
// false (wait in the netpoller) then; true only on an error that ends
// Serve (r.fatal).
func (r *Reader) serveBatches(fd uintptr) bool {
	if r.sleepers.Load() > 0 {
		return false // a consumer in Wait reads it before it leaves
	}
	r.progress(fd, false, true)
	return r.fatal.Load() != 0
}

// Progress reads and hands to Serve's handler, on the calling goroutine,
// what waits on the socket, without blocking. It is how a consumer that
// would otherwise wait for Serve's goroutine makes progress itself (a
// software provider's manual progress): one goroutine reads at a time,
// and one that finds another reading returns at once, leaving it what
// arrived (that one reads on until the socket is empty). It does nothing
// before Serve runs or after the socket is closed. A socket that can take
// its readability out of the netpoller (rawudp.Conn) does, for leaseTime
// after the last Progress or Wait: a consumer that polls in a loop then
// reads everything, and Serve's thread is not woken to take a core from
// it. A consumer that waits by other means afterwards (a channel, an
// epoll of its own) calls ReadNow instead, or EndLease before it waits.
// It allocates nothing.
func (r *Reader) Progress() {
	r.touch()
	_ = r.raw.Control(r.progressFn)
}

// InServe reports, inside Serve's handler, whether the handler runs on
// Serve's own goroutine rather than on a consumer's in Progress, ReadNow
// or Wait (a handler that yields the processor to woken consumers yields
// only on Serve's goroutine: a consumer would yield to itself, and a C
// thread's cgo callback would hand its Go runtime to another thread). It
// is valid only inside the handler.
func (r *Reader) InServe() bool { return r.byServe }

// ReadNow is Progress without the lease: Serve goes on reading the socket
// (for a consumer that polls and then waits for Serve's deliveries, as
// one with a completion channel of its own in its epoll).
func (r *Reader) ReadNow() { _ = r.raw.Control(r.progressFn) }

// EndLease puts a socket that Progress took out of the netpoller back at
// once (unless a goroutine waits in Wait) and reads what waits: for a
// consumer about to wait for Serve's deliveries. One epoll_ctl when a
// lease was running; nothing else.
func (r *Reader) EndLease() {
	if r.pauser == nil || !r.paused.Load() {
		return
	}
	r.pmu.Lock()
	defer r.pmu.Unlock()
	if r.paused.Load() && r.sleepers.Load() == 0 {
		r.resumeLocked()
	}
}

// progress is Progress on fd (held open by the caller): the read lock is
// taken without waiting; a goroutine that finds it held marks pending, and
// the holder, once it unlocks, reads again while pending is set, so no
// datagram whose readiness woke a goroutine that gave up waits unread.
//
// With one, a consumer reads one batch and leaves the rest to its next
// call (or to the lease's end); but once a goroutine found the lock held
// and gave up, the holder reads until the socket is empty: the one that
// gave up may be Serve's, gone back to the netpoller, which no readiness
// wakes again until another datagram comes (a consumer's ReadNow, with no
// lease to read the rest, left it unread until then).
func (r *Reader) progress(fd uintptr, one, byServe bool) int {
	total := 0
	for {
		r.pending.Store(true)
		if !r.mu.TryLock() {
			return total
		}
		r.pending.Store(false)
		if r.serve != nil && r.fatal.Load() == 0 {
			r.byServe = byServe
			total += r.drainLocked(fd, one)
			r.byServe = false
		}
		r.mu.Unlock()
		if !r.pending.Load() {
			return total
		}
		one = false
	}
}

// drainLocked reads and hands over batches while they come full (with
// one, a single batch) (r.mu held) and returns how many datagrams it
// handled; an error that is not transient is kept in r.fatal.
func (r *Reader) drainLocked(fd uintptr, one bool) int {
	total := 0
	for {
		if !r.recvmmsg(fd) {
			return total // empty: the batch went back to the pool
		}
		switch r.errno {
		case 0:
		case unix.EINTR, unix.ENOMEM, unix.ENOBUFS:
			continue // transient
		default:
			if r.async(r.errno) {
				continue // the datagrams queued behind it are still there
			}
			r.fatal.Store(uint32(r.errno))
			return total
		}
		r.serve(r.n)
		total += r.n
		if r.eof {
			r.eof = false
			r.fatal.Store(uint32(unix.ECONNRESET))
			r.Release()
			return total
		}
		if r.n < len(r.b.Hdrs) || one {
			r.Release()
			return total
		}
	}
}

// maxWait bounds one Wait: a socket being closed waits for no longer
// than this for a waiter that was not woken.
const maxWait = 100 * time.Millisecond

// Wait blocks the calling thread until the socket has a datagram, kick
// rings, timeout (at most 100 ms) passes or a signal arrives; then it
// calls woke (if not nil), makes progress (as Progress) and reports
// whether kick rang. It is the wait of a consumer that reads the socket
// itself, woken by the kernel directly: a blocking system call, not Go's
// netpoller, so that a datagram wakes one thread — the consumer's — and no
// goroutine hand-off follows. The first waiter of a socket that can leave
// the netpoller (rawudp.Conn) blocks in the receive itself, one system
// call (see blocking.go); others block in ppoll(2) on the socket and
// kick's eventfd, then read. While a goroutine waits here, Serve's
// goroutine leaves the socket to it: a rawudp.Conn leaves the netpoller
// for as long as goroutines wait and leaseTime after, so that Serve's
// thread is not even woken.
// err is non-nil when the socket is closed. The socket stays open (a close
// waits) until Wait returns: close it after a shutdown(SHUT_RD), which
// wakes its waiters.
func (r *Reader) Wait(kick *pollfd.Kick, timeout time.Duration, woke func()) (kicked bool, err error) {
	c := waitCalls.Get().(*waitCall)
	c.r, c.kick, c.timeout, c.woke = r, kick, min(max(timeout, 0), maxWait), woke
	r.sleep(1)
	err = r.raw.Control(c.fn)
	// Serve reads again after the lease; a datagram that came after the
	// progress above wakes it as the socket goes back into the netpoller.
	r.sleep(-1)
	kicked = c.kicked
	*c = waitCall{fn: c.fn}
	waitCalls.Put(c)
	return kicked, err
}

// waitCall is one Wait's arguments and result, for the function it runs
// under the socket's Control: a closure made per call would be a heap
// allocation on every wait (it escapes into the RawConn).
type waitCall struct {
	r       *Reader
	kick    *pollfd.Kick
	timeout time.Duration
	woke    func()
	kicked  bool
	fn      func(fd uintptr) // run, bound once
}

var waitCalls = sync.Pool{New: func() any {
	c := new(waitCall)
	c.fn = c.run
	return c
}}

// run is Wait's body, with the socket's descriptor.
func (c *waitCall) run(fd uintptr) {
	r, timeout := c.r, c.timeout
	if timeout > 0 && r.pauser != nil && !r.endOnEmpty && !r.noBlock.Load() && r.mu.TryLock() {
		r.pending.Store(false)
		if r.serve != nil && r.fatal.Load() == 0 && r.blockingLocked(fd, timeout) {
			c.kicked = r.waitLocked(fd, c.kick, c.woke)
			return
		}
		r.mu.Unlock()
		if r.pending.Load() {
			r.progress(fd, false, false)
		}
	}
	ts := unix.NsecToTimespec(int64(timeout))
	_, c.kicked = pollfd.Wait2(int(fd), c.kick.Fd, &ts)
	if c.woke != nil {
		c.woke()
	}
	r.progress(fd, r.pauser != nil, false)
}

// leaseTime is how long a socket that can leave the netpoller stays out
// of it after the last Progress or Wait: between one and two leaseTimes.
// A consumer that polls or waits again within it (one that answers what
// it receives, or polls in a loop) pays no epoll_ctl, and Serve's thread
// stays asleep. What arrives meanwhile waits for the next Wait or
// Progress, or at the latest for the lease's end, when Serve reads it.
const leaseTime = time.Millisecond

// sleep counts a goroutine into Wait (d 1) or out of it (d -1). The first
// in takes the socket's readability out of the netpoller; the lease puts
// it back once no goroutine has waited or polled for a while (which wakes
// Serve if datagrams wait).
func (r *Reader) sleep(d int32) {
	if r.pauser == nil {
		r.sleepers.Add(d)
		return
	}
	if d < 0 {
		r.uses.Add(1)
		r.sleepers.Add(d)
		return
	}
	r.sleepers.Add(d)
	if !r.paused.Load() {
		r.pause()
	}
}

// touch takes the socket's readability out of the netpoller for a
// consumer that polls it (Progress), for the lease. Two atomic operations
// while the lease lasts: no lock, no clock.
func (r *Reader) touch() {
	if r.pauser == nil {
		return
	}
	r.uses.Add(1)
	if !r.paused.Load() {
		r.pause()
	}
}

// pause takes the socket out of the netpoller and starts the lease.
func (r *Reader) pause() {
	r.pmu.Lock()
	defer r.pmu.Unlock()
	if r.paused.Load() || r.stopped || r.pauser.SetReadInterest(false) != nil {
		return
	}
	r.paused.Store(true)
	r.seen = r.uses.Load()
	if r.lease == nil {
		r.lease = time.AfterFunc(leaseTime, r.leaseOver)
	} else {
		r.lease.Reset(leaseTime)
	}
}

// leaseOver puts the socket back into the netpoller if no goroutine has
// waited or polled since the lease's last look, and reads what waits;
// else it looks again after leaseTime.
func (r *Reader) leaseOver() {
	r.pmu.Lock()
	defer r.pmu.Unlock()
	if !r.paused.Load() || r.stopped {
		return
	}
	if u := r.uses.Load(); u != r.seen || r.sleepers.Load() > 0 {
		r.seen = u
		r.lease.Reset(leaseTime)
		return
	}
	r.resumeLocked()
}

// resumeLocked puts the socket back into the netpoller and reads what came
// during the lease (r.pmu held): putting it back need not wake Serve
// (epoll_ctl wakes nobody for an item already on the epoll's ready list);
// what comes from now on wakes Serve.
func (r *Reader) resumeLocked() {
	_ = r.pauser.SetReadInterest(true)
	r.paused.Store(false)
	_ = r.raw.Control(r.progressFn)
}

// stopLease ends the lease of a reader whose Serve returns.
func (r *Reader) stopLease() {
	r.pmu.Lock()
	r.stopped = true
	if r.lease != nil {
		r.lease.Stop()
	}
	r.pmu.Unlock()
}

// readPauser is a socket that can take its readability out of the
// netpoller (rawudp.Conn).
type readPauser interface{ SetReadInterest(on bool) error }

// Datagram returns the i-th datagram of the last Read, as
// Batch.Datagram.
func (r *Reader) Datagram(i int) (data, name, oob []byte, trunc bool) {
	return r.b.Datagram(i)
}

// Release gives a pooled reader's batch back to its pool; it does nothing
// for a reader with its own batch.
func (r *Reader) Release() {
	if r.pool != nil && r.b != nil {
		r.pool.Put(r.b)
		r.b = nil
	}
}

// Sender makes sendmmsg calls through a RawConn without allocating (its
// RawConn callback is bound once). The zero Sender is not ready: use
// NewSender, or Init on a Sender inside pooled memory.
type Sender struct {
	hs    []unix.Mmsghdr
	n     int
	errno syscall.Errno
	fn    func(fd uintptr) bool

	asyncErrs atomic.Uint64 // async errors a send met and went past (AsyncErrors)
}

// AsyncErrors returns how many errors kept for ICMP messages (AsyncError)
// failed a sendmmsg that was then made again.
func (s *Sender) AsyncErrors() uint64 { return s.asyncErrs.Load() }

// NewSender returns a ready Sender.
func NewSender() *Sender {
	s := &Sender{}
	s.Init()
	return s
}

// Init readies s.
func (s *Sender) Init() { s.fn = s.sendmmsg }

// sendmmsg is the RawConn.Write callback: one sendmmsg; false (wait in the
// netpoller) while the send buffer is full.
//
// A raw system call, as recvmmsg: with MSG_DONTWAIT it never blocks, and
// a Syscall would wake the runtime's sysmon thread when it sleeps — a
// thread wake-up (and a core taken from the peer) on every send of a
// sender that otherwise waits, the latency part's ping-pong.
//
// An error the kernel kept for an ICMP message (AsyncError) fails the
// call before anything is sent, and is cleared: the call is made once
// more, whose error, if any, is then the datagram's own (EMSGSIZE is
// both).
func (s *Sender) sendmmsg(fd uintptr) bool {
	n, _, e := unix.RawSyscall6(unix.SYS_SENDMMSG, fd, uintptr(unsafe.Pointer(&s.hs[0])), uintptr(len(s.hs)), unix.MSG_DONTWAIT, 0, 0)
	if e != 0 && AsyncError(e) {
		s.asyncErrs.Add(1)
		n, _, e = unix.RawSyscall6(unix.SYS_SENDMMSG, fd, uintptr(unsafe.Pointer(&s.hs[0])), uintptr(len(s.hs)), unix.MSG_DONTWAIT, 0, 0)
	}
	if e == unix.EAGAIN {
		return false
	}
	s.n, s.errno = int(n), e
	if e != 0 {
		s.n = 0
	}
	return true
}

// Send makes one sendmmsg call for hs (not empty) on raw, waiting in the
// netpoller while the socket cannot take any. It returns how many messages
// the kernel took (at least one) and errno 0, or 0 and the errno of
// sending hs[0]; the caller sends the rest with further calls. err is
// non-nil when the wait failed (socket closed, deadline): nothing was
// sent.
func (s *Sender) Send(raw syscall.RawConn, hs []unix.Mmsghdr) (n int, errno syscall.Errno, err error) {
	s.hs = hs
	err = raw.Write(s.fn)
	s.hs = nil
	if err != nil {
		return 0, 0, err
	}
	return s.n, s.errno, nil
}

// AddrPort returns the address in a raw sockaddr as recvmmsg fills it in
// (a unix.RawSockaddrInet4 or RawSockaddrInet6), IPv4-mapped addresses
// unmapped; the zero AddrPort for anything else.
func AddrPort(name []byte) netip.AddrPort {
	if len(name) < 2 {
		return netip.AddrPort{}
	}
	switch binary.NativeEndian.Uint16(name) {
	case unix.AF_INET:
		if len(name) >= unix.SizeofSockaddrInet4 {
			return netip.AddrPortFrom(netip.AddrFrom4([4]byte(name[4:8])), binary.BigEndian.Uint16(name[2:4]))
		}
	case unix.AF_INET6:
		if len(name) >= unix.SizeofSockaddrInet6 {
			return netip.AddrPortFrom(netip.AddrFrom16([16]byte(name[8:24])).Unmap(), binary.BigEndian.Uint16(name[2:4]))
		}
	}
	return netip.AddrPort{}
}

// PutAddrPort writes a as a raw sockaddr into name (at least
// unix.SizeofSockaddrInet6 bytes) and returns its length: an IPv4 address
// as a RawSockaddrInet4, any other as a RawSockaddrInet6.
func PutAddrPort(name []byte, a netip.AddrPort) uint32 {
	clear(name[:unix.SizeofSockaddrInet6])
	binary.BigEndian.PutUint16(name[2:4], a.Port())
	if ip := a.Addr(); ip.Is4() {
		binary.NativeEndian.PutUint16(name, unix.AF_INET)
		ip4 := ip.As4()
		copy(name[4:8], ip4[:])
		return unix.SizeofSockaddrInet4
	}
	binary.NativeEndian.PutUint16(name, unix.AF_INET6)
	ip16 := a.Addr().As16()
	copy(name[8:24], ip16[:])
	return unix.SizeofSockaddrInet6
}
