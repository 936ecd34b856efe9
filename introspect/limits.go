package introspect

import (
	"net"
	"net/http"
	"sync"
	"time"
)

// What one process's endpoint spends at most. A capture past MaxCaptures
// is refused at once; a frame the writer cannot keep up with is dropped
// and counted by the capture. Connections are accepted as they come (see
// gate.go): those without a whole, trusted request are pendingBudget at
// most over the process, the oldest closed first; a trusted connection
// past MaxConns waits for a slot, which connections holding one without a
// request lose.

// MaxCaptures is the number of captures the endpoints of one process
// stream at once; one more is refused with 503 Service Unavailable.
const MaxCaptures = 4

// MaxConns is the number of trusted connections (see Serve) one endpoint
// serves at once.
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
// when a connection closes. While every slot is taken, it closes the
// connections that hold one without using it — idle between requests, or
// connected for longer than slowRequest without a whole request — so that
// clients that connect and send nothing (or half a request, slowly) cannot
// keep a good request waiting.
type limitListener struct {
	net.Listener
	sem       chan struct{}
	done      chan struct{}
	closeOnce sync.Once

	mu   sync.Mutex
	idle map[net.Conn]time.Time // connections in StateNew (since) or StateIdle (zero time)
}

// slowRequest is how long a connection may take to send its request
// before it loses its slot to a waiting one; evictEvery is how often a
// full listener looks.
const (
	slowRequest = 300 * time.Millisecond
	evictEvery  = 100 * time.Millisecond
)

func newLimitListener(ln net.Listener, n int) *limitListener {
	return &limitListener{Listener: ln, sem: make(chan struct{}, n), done: make(chan struct{}), idle: map[net.Conn]time.Time{}}
}

// Accept waits for a free slot, then for a connection. While it waits,
// it evicts the connections that hold a slot without using it.
func (l *limitListener) Accept() (net.Conn, error) {
	var tick *time.Ticker
	for acquired := false; !acquired; {
		select {
		case l.sem <- struct{}{}:
			acquired = true
		case <-l.done:
			if tick != nil {
				tick.Stop()
			}
			return nil, net.ErrClosed
		default:
			if tick == nil {
				tick = time.NewTicker(evictEvery)
			}
			select {
			case l.sem <- struct{}{}:
				acquired = true
			case <-l.done:
				tick.Stop()
				return nil, net.ErrClosed
			case <-tick.C:
				l.evict()
			}
		}
	}
	if tick != nil {
		tick.Stop()
	}
	c, err := l.Listener.Accept()
	if err != nil {
		<-l.sem
		return nil, err
	}
	return c, nil
}

// evict closes the idle connections and those that have not sent a whole
// request within slowRequest; the server then frees their slots.
func (l *limitListener) evict() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for c, since := range l.idle {
		if since.IsZero() || time.Since(since) > slowRequest {
			c.Close()
			delete(l.idle, c)
		}
	}
}

// Close closes the listener and ends a waiting Accept.
func (l *limitListener) Close() error {
	l.closeOnce.Do(func() { close(l.done) })
	return l.Listener.Close()
}

// connState frees a connection's slot when the server is done with it,
// and keeps track of the connections that hold one without using it.
func (l *limitListener) connState(c net.Conn, st http.ConnState) {
	l.mu.Lock()
	switch st {
	case http.StateNew:
		l.idle[c] = time.Now()
	case http.StateIdle:
		l.idle[c] = time.Time{}
	default:
		delete(l.idle, c)
	}
	l.mu.Unlock()
	if st == http.StateClosed || st == http.StateHijacked {
		<-l.sem
	}
}
