package introspect

import (
	"net"
	"net/http"
	"sync"
	"time"
)

// What one process's endpoint spends at most. Nothing waits in a queue of
// ours: a capture past MaxCaptures is refused at once, a connection past
// MaxConns waits in the kernel's listen backlog (bounded by it), a frame
// the writer cannot keep up with is dropped and counted by the capture.

// MaxCaptures is the number of captures the endpoints of one process
// stream at once; one more is refused with 503 Service Unavailable.
const MaxCaptures = 4

// MaxConns is the number of connections one endpoint serves at once.
const MaxConns = 16

// captureSlots holds one token per running capture of the process.
var captureSlots = make(chan struct{}, MaxCaptures)

// responseWriteTimeout bounds the writing of a whole response other than
// a capture stream (a reader that stalls longer loses its connection).
const responseWriteTimeout = 30 * time.Second

// captureWriteTimeout bounds each write of a capture stream: a client
// that takes nothing for that long (stalled, or gone without closing) ends
// its capture and frees its slot. A variable for tests.
var captureWriteTimeout = 10 * time.Second

// limitListener accepts a connection only while fewer than cap(sem) are
// open. It passes connections through unwrapped (the peer credentials of
// a *net.UnixConn stay readable); the server's ConnState hook frees a slot
// when a connection closes.
type limitListener struct {
	net.Listener
	sem       chan struct{}
	done      chan struct{}
	closeOnce sync.Once
}

func newLimitListener(ln net.Listener, n int) *limitListener {
	return &limitListener{Listener: ln, sem: make(chan struct{}, n), done: make(chan struct{})}
}

// Accept waits for a free slot, then for a connection.
func (l *limitListener) Accept() (net.Conn, error) {
	select {
	case l.sem <- struct{}{}:
	case <-l.done:
		return nil, net.ErrClosed
	}
	c, err := l.Listener.Accept()
	if err != nil {
		<-l.sem
		return nil, err
	}
	return c, nil
}

// Close closes the listener and ends a waiting Accept.
func (l *limitListener) Close() error {
	l.closeOnce.Do(func() { close(l.done) })
	return l.Listener.Close()
}

// connState frees a connection's slot when the server is done with it.
func (l *limitListener) connState(_ net.Conn, st http.ConnState) {
	if st == http.StateClosed || st == http.StateHijacked {
		<-l.sem
	}
}
