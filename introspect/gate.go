package introspect

import (
	"bufio"
	"bytes"
	"container/list"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"strconv"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// The gate stands between an endpoint's listener and its HTTP server, so
// that connections nobody vouches for cannot keep one that is vouched for
// waiting:
//   - it accepts every connection at once: the kernel's accept queue stays
//     short, so a new connection is not stuck behind thousands of others;
//   - a connection trusted without a request — on a Unix socket, a peer
//     of this process's effective uid or root (SO_PEERCRED, read at
//     accept) — goes straight to the server, never waiting for others;
//   - any other (TCP, or a Unix peer of another uid, who only ever gets a
//     403) is screened: its request header is read, within headerTimeout
//     to twice that, and only a request the trust model lets through
//     (Host and token on TCP) goes on to the server with its bytes; any
//     other is answered with its error (401, 403, 400, 431) and closed;
//   - screened connections are pending until then: at most pendingBudget
//     in the process, and one more closes the oldest pending one. A
//     request with the token, passed on the moment its header has
//     arrived, is never the oldest for long. Below the budget nothing is
//     closed early, which matters: a closed connection comes back at once
//     and a new one waits behind it in the accept queue;
//   - when the process runs out of file descriptors, accepting closes the
//     oldest pending connection before anything else.

// headerTimeout is the time a screened connection has at least to send
// its whole request header; each has up to twice that, drawn at random,
// so that connections made together (a flood) are not closed together
// and do not all come back at once. A variable for tests.
var headerTimeout = 10 * time.Second

// maxHeaderBytes bounds a screened request header (as the server's
// MaxHeaderBytes, with net/http's slack).
const maxHeaderBytes = 16<<10 + 4096

// firstPause and maxPause bound the pauses between reads of a request
// header that comes in pieces (see screen).
const (
	firstPause = 200 * time.Millisecond
	maxPause   = 4 * time.Second
)

// pendingBudget is the number of screened connections the process keeps
// open at once, over all its endpoints: a quarter of its file descriptor
// limit (RLIMIT_NOFILE), between 64 and 4096. A variable for tests.
var pendingBudget = fdBudget()

func fdBudget() int {
	var rl syscall.Rlimit
	n := 1024
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err == nil && rl.Cur < 1<<20 {
		n = int(rl.Cur) / 4
	} else if err == nil {
		n = 4096
	}
	return min(max(n, 64), 4096)
}

// pending holds every screened connection of the process, oldest first.
var pending struct {
	mu   sync.Mutex
	list list.List // of *screened
}

// screened is a connection whose request header is being read.
type screened struct {
	c     net.Conn
	g     *gate
	uid   int // the Unix peer's uid (-1: unknown); 0 on TCP
	since time.Time
	elem  *list.Element // nil once it has left the pending list
	gone  chan struct{} // closed when it leaves the list
	// exited is closed when the goroutine screening it has returned: a
	// read in progress holds the descriptor, which the kernel gets back
	// only then.
	exited chan struct{}
}

// gate is the listener the HTTP server accepts from: connections trusted
// from the start, and screened ones whose request passed.
type gate struct {
	net.Listener
	s     *Server
	ready chan net.Conn
	done  chan struct{}
	// headerTimeout, when the gate was made
	headerTimeout time.Duration
	wg            sync.WaitGroup // the accept loop and every connection's goroutine

	closeOnce sync.Once // Close
	doneOnce  sync.Once // closing done
	errMu     sync.Mutex
	err       error // why the accept loop ended
}

func newGate(s *Server, ln net.Listener) *gate {
	g := &gate{Listener: ln, s: s, ready: make(chan net.Conn), done: make(chan struct{}), headerTimeout: headerTimeout}
	g.wg.Add(1)
	go g.loop()
	return g
}

// Accept returns the next connection for the server.
func (g *gate) Accept() (net.Conn, error) {
	select {
	case c := <-g.ready:
		return c, nil
	case <-g.done:
		g.errMu.Lock()
		err := g.err
		g.errMu.Unlock()
		if err == nil {
			err = net.ErrClosed
		}
		return nil, err
	}
}

// Close closes the listener and every connection not yet handed to the
// server, and waits for the gate's goroutines.
func (g *gate) Close() error {
	var err error
	g.closeOnce.Do(func() {
		g.doneOnce.Do(func() { close(g.done) })
		err = g.Listener.Close()
		pending.mu.Lock()
		for e := pending.list.Front(); e != nil; {
			next := e.Next()
			if p := e.Value.(*screened); p.g == g {
				g.dropLocked(p)
			}
			e = next
		}
		pending.mu.Unlock()
		g.wg.Wait()
	})
	return err
}

// loop accepts connections until the listener fails or closes.
func (g *gate) loop() {
	defer g.wg.Done()
	var backoff time.Duration
	for {
		c, err := g.Listener.Accept()
		if err != nil {
			if errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) {
				// Linux takes the descriptor before it looks at the
				// queue: with none left, accept fails so even when
				// no connection waits. Evict only for one that does.
				if queued, known := waitQueued(g.Listener, queuedPoll); known && !queued {
					select {
					case <-g.done:
						return
					default:
						continue
					}
				}
				if exited := evictOldest(); exited != nil {
					// Accept again once the evicted connection's
					// descriptor is free, not at once: that would
					// find none and close the next oldest too.
					t := time.NewTimer(evictWait)
					select {
					case <-exited:
					case <-t.C:
					case <-g.done:
					}
					t.Stop()
					continue
				}
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() || isTemporary(err) {
				backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
				t := time.NewTimer(backoff)
				select {
				case <-t.C:
					continue
				case <-g.done:
					t.Stop()
					return
				}
			}
			g.errMu.Lock()
			g.err = err
			g.errMu.Unlock()
			g.doneOnce.Do(func() { close(g.done) })
			return
		}
		backoff = 0
		g.admit(c)
	}
}

// isTemporary reports the accept errors net/http retries after a pause.
func isTemporary(err error) bool {
	var te interface{ Temporary() bool }
	return errors.As(err, &te) && te.Temporary()
}

// admit hands c to the server if it is trusted without a request, else
// screens it.
func (g *gate) admit(c net.Conn) {
	uid := 0
	if g.s.network == "unix" {
		uid = -1
		if cred, err := peerCred(c); err == nil {
			uid = int(cred.Uid)
		}
		if uid == 0 || uid == os.Geteuid() {
			g.wg.Add(1)
			go func() {
				defer g.wg.Done()
				g.handOver(c)
			}()
			return
		}
	}
	p := &screened{c: c, g: g, uid: uid, since: time.Now(), gone: make(chan struct{}), exited: make(chan struct{})}
	pending.mu.Lock()
	select {
	case <-g.done: // closed while accepting
		pending.mu.Unlock()
		c.Close()
		return
	default:
	}
	for pending.list.Len() >= pendingBudget && pending.list.Len() > 0 {
		q := pending.list.Front().Value.(*screened)
		q.g.dropLocked(q)
	}
	p.elem = pending.list.PushBack(p)
	g.wg.Add(1)
	pending.mu.Unlock()
	go func() {
		defer g.wg.Done()
		defer close(p.exited)
		g.screen(p)
	}()
}

// evictWait bounds the wait for an evicted connection's descriptor;
// queuedPoll, one wait of a gate out of descriptors for a connection to
// arrive.
const (
	evictWait  = 100 * time.Millisecond
	queuedPoll = 100 * time.Millisecond
)

// waitQueued waits up to d for a connection to wait in ln's accept queue
// and reports whether one does; known is false where ln cannot say (not a
// socket of this process). It blocks a thread, not only a goroutine: it
// runs only while the process has no descriptor left, when Go's poller
// cannot wait for the listener (accept fails at once).
func waitQueued(ln net.Listener, d time.Duration) (queued, known bool) {
	sc, ok := ln.(syscall.Conn)
	if !ok {
		return false, false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false, false
	}
	err = rc.Control(func(fd uintptr) {
		known = true
		pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		n, err := unix.Poll(pfd, int(d/time.Millisecond))
		queued = err == nil && n > 0 && pfd[0].Revents&unix.POLLIN != 0
	})
	if err != nil {
		return false, false
	}
	return queued, known
}

// evictOldest closes the oldest pending connection of the process and
// returns the channel closed when its descriptor is free; nil if there
// is none.
func evictOldest() <-chan struct{} {
	pending.mu.Lock()
	defer pending.mu.Unlock()
	e := pending.list.Front()
	if e == nil {
		return nil
	}
	p := e.Value.(*screened)
	p.g.dropLocked(p)
	return p.exited
}

// dropLocked closes a pending connection and takes it off the list.
func (g *gate) dropLocked(p *screened) {
	g.leaveLocked(p)
	p.c.Close()
}

// leaveLocked takes p off the pending list; false if it was no longer
// there (closed by an eviction or Close).
func (g *gate) leaveLocked(p *screened) bool {
	if p.elem == nil {
		return false
	}
	pending.list.Remove(p.elem)
	p.elem = nil
	close(p.gone)
	return true
}

// leave takes p off the pending list; false if it was evicted meanwhile.
func (g *gate) leave(p *screened) bool {
	pending.mu.Lock()
	defer pending.mu.Unlock()
	return g.leaveLocked(p)
}

// handOver gives c to the server, or closes it if the gate closes first.
func (g *gate) handOver(c net.Conn) {
	select {
	case g.ready <- c:
	case <-g.done:
		c.Close()
	}
}

// screen reads p's request header and hands the connection on if the
// trust model lets the request through; it answers any other.
func (g *gate) screen(p *screened) {
	c := p.c
	c.SetReadDeadline(p.since.Add(g.headerTimeout + rand.N(g.headerTimeout)))
	buf := make([]byte, 0, 1024)
	end := -1
	// A header that does not come whole is read again after a pause, from
	// firstPause (to twice that, at random, so that connections made
	// together are not read together) doubling up to maxPause: a
	// connection that sends it a byte at a time costs a wakeup per pause,
	// not per byte.
	var pause time.Duration
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for end < 0 {
		if pause > 0 {
			if timer == nil {
				timer = time.NewTimer(pause)
			} else {
				timer.Reset(pause)
			}
			select {
			case <-timer.C:
			case <-p.gone: // evicted, or the gate closed
				return
			}
		}
		if len(buf) == cap(buf) {
			if len(buf) >= maxHeaderBytes {
				break
			}
			buf = append(make([]byte, 0, min(2*cap(buf), maxHeaderBytes)), buf...)
		}
		n, err := c.Read(buf[len(buf):cap(buf)])
		from := max(len(buf)-3, 0)
		buf = buf[:len(buf)+n]
		end = headerEnd(buf, from)
		if end < 0 && err != nil {
			if g.leave(p) {
				c.Close()
			}
			return
		}
		if len(buf) < cap(buf) { // all there was: wait for more
			pause = min(max(2*pause, firstPause+rand.N(firstPause)), maxPause)
		} else {
			pause = 0 // maybe more: read again at once
		}
	}
	if !g.leave(p) {
		return // evicted
	}
	c.SetReadDeadline(time.Time{})
	if end < 0 {
		g.refuse(c, false, http.StatusRequestHeaderFieldsTooLarge, fmt.Sprintf("request header larger than %d bytes", maxHeaderBytes))
		return
	}
	r, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(buf[:end])))
	if err != nil {
		g.refuse(c, false, http.StatusBadRequest, "malformed request: "+err.Error())
		return
	}
	if g.s.network == "unix" {
		pi := peerInfo{uid: p.uid, err: errors.New("the listener does not give Unix socket connections")}
		if _, ok := c.(*net.UnixConn); ok {
			pi.err = nil
			if cred, err := peerCred(c); err != nil {
				pi.err = err
			} else {
				pi.uid, pi.pid = int(cred.Uid), int(cred.Pid)
			}
		}
		r = r.WithContext(context.WithValue(r.Context(), peerKey{}, pi))
	}
	if code, msg := g.s.refusal(r); code != 0 {
		g.refuse(c, r.Method == http.MethodHead, code, msg)
		return
	}
	g.handOver(&replayConn{Conn: c, buf: buf})
}

// headerEnd returns the offset just past the blank line ending the header
// in b (searching from from), or -1.
func headerEnd(b []byte, from int) int {
	for i := from; i < len(b); i++ {
		if b[i] != '\n' {
			continue
		}
		if i >= 1 && b[i-1] == '\n' {
			return i + 1
		}
		if i >= 2 && b[i-1] == '\r' && b[i-2] == '\n' {
			return i + 1
		}
	}
	return -1
}

// refuse answers a screened request with an error and closes the
// connection.
func (g *gate) refuse(c net.Conn, head bool, code int, msg string) {
	defer c.Close()
	body, _ := json.Marshal(errorBody{msg})
	body = append(body, '\n')
	var b bytes.Buffer
	fmt.Fprintf(&b, "HTTP/1.1 %d %s\r\n", code, http.StatusText(code))
	b.WriteString("Content-Type: application/json\r\nX-Content-Type-Options: nosniff\r\nConnection: close\r\n")
	if code == http.StatusUnauthorized {
		b.WriteString("WWW-Authenticate: Bearer realm=\"softrdma\"\r\n")
	}
	b.WriteString("Content-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n")
	if !head {
		b.Write(body)
	}
	c.SetWriteDeadline(time.Now().Add(time.Second))
	c.Write(b.Bytes())
}

// replayConn is a screened connection handed to the server: its reads
// return the bytes the gate read first.
type replayConn struct {
	net.Conn
	buf []byte
}

// Read returns the bytes the gate read, then reads the connection.
func (c *replayConn) Read(p []byte) (int, error) {
	if len(c.buf) > 0 {
		n := copy(p, c.buf)
		c.buf = c.buf[n:]
		return n, nil
	}
	return c.Conn.Read(p)
}

// CloseWrite shuts down the writing side, as net/http does before it
// closes a connection after an error.
func (c *replayConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}
