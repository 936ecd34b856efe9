package introspect

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/softrdma/softrdma/test/testenv"
)

// pendingOf returns the number of connections g screens now.
func pendingOf(srv *Server) int {
	g := srv.ln.(*limitListener).Listener.(*gate)
	pending.mu.Lock()
	defer pending.mu.Unlock()
	n := 0
	for e := pending.list.Front(); e != nil; e = e.Next() {
		if e.Value.(*screened).g == g {
			n++
		}
	}
	return n
}

// waitFor waits up to 10 s for cond.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("waited 10 s for %s", what)
		}
	}
}

// closedByServer reports whether the server closed conn (a read ends
// without data within 5 s).
func closedByServer(conn net.Conn) bool {
	conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	n, err := conn.Read(make([]byte, 1))
	return n == 0 && err != nil && !os.IsTimeout(err)
}

// TestPendingBudget: past the process's budget of connections without a
// whole request, each new one closes the oldest, and a request with the
// token is still answered; a connection that does not send its whole
// request header within headerTimeout is closed.
//
// A network namespace of its own keeps other programs' connections away
// from the counts.
func TestPendingBudget(t *testing.T) {
	if !testenv.InNetns(t) {
		return
	}
	oldBudget, oldTimeout := pendingBudget, headerTimeout
	pendingBudget, headerTimeout = 8, time.Hour
	t.Cleanup(func() { pendingBudget, headerTimeout = oldBudget, oldTimeout })
	srv := startTCPEndpoint(t)
	var conns []net.Conn
	for i := range 20 {
		conn := dialTCP(t, srv.Addr())
		fmt.Fprintf(conn, "GET /v1/devices HTTP/1.1\r\nHost: %s\r\n", srv.Addr())
		conns = append(conns, conn)
		waitFor(t, fmt.Sprintf("connection %d screened", i), func() bool { return pendingOf(srv) == min(i+1, 8) })
	}
	for i, conn := range conns[:12] {
		if !closedByServer(conn) {
			t.Errorf("connection %d of 20 (budget 8) still open", i)
		}
	}
	goodRequestWithin(t, srv, time.Second, "8 connections without a whole request, at the budget")
	// The good request took the place of the oldest of the eight.
	if !closedByServer(conns[12]) {
		t.Error("the oldest pending connection was not closed for the good request")
	}
	if n := pendingOf(srv); n != 7 {
		t.Errorf("%d connections pending, want 7", n)
	}

	headerTimeout = 200 * time.Millisecond
	srv = startTCPEndpoint(t)
	slow := dialTCP(t, srv.Addr())
	fmt.Fprintf(slow, "GET /v1/devices HTTP/1.1\r\n")
	start := time.Now()
	if !closedByServer(slow) {
		t.Error("a connection without its whole request header was not closed")
	} else if d := time.Since(start); d < headerTimeout/2 {
		t.Errorf("closed after %v, before its %v", d, headerTimeout)
	}
}

// lowestFreeFD returns the descriptor number this process's next open
// would take: the lowest one free. RLIMIT_NOFILE bounds descriptor
// numbers, not their count, so a limit one above it leaves exactly that
// one free, whatever holes the descriptor table has above it.
func lowestFreeFD(t *testing.T) uint64 {
	t.Helper()
	f, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	return uint64(f.Fd())
}

// TestOutOfDescriptors: when the process has no descriptor left for the
// next connection (EMFILE), the endpoint closes its oldest connection
// without a whole request and accepts it: a request with the token is
// answered — and only it: with no descriptor left, accept fails with
// EMFILE even when no connection waits (Linux takes the descriptor
// before it looks at the queue), which is no reason to close another.
//
// It runs alone in a process and a network namespace of its own: the
// descriptor limit is the process's, so a descriptor any other test of the
// process opened meanwhile, or a connection another program on the host
// made to the endpoint's port, would take the one left and evict a second
// connection (CI saw "3 connections pending" twice).
func TestOutOfDescriptors(t *testing.T) {
	if !testenv.InNetns(t) {
		return
	}
	oldTimeout := headerTimeout
	headerTimeout = time.Hour
	t.Cleanup(func() { headerTimeout = oldTimeout })
	srv := startTCPEndpoint(t)
	const k = 5
	var conns []net.Conn
	for i := range k {
		conn := dialTCP(t, srv.Addr())
		fmt.Fprintf(conn, "GET /v1/devices HTTP/1.1\r\nHost: %s\r\n", srv.Addr())
		conns = append(conns, conn)
		waitFor(t, fmt.Sprintf("connection %d screened", i), func() bool { return pendingOf(srv) == i+1 })
	}
	var old syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &old); err != nil {
		t.Fatal(err)
	}
	// One descriptor left: the good request's own socket takes it, and
	// the endpoint finds none for accepting it.
	lim := old
	lim.Cur = lowestFreeFD(t) + 1
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	restored := false
	restore := func() {
		if !restored {
			restored = true
			syscall.Setrlimit(syscall.RLIMIT_NOFILE, &old)
		}
	}
	t.Cleanup(restore)
	goodRequestWithin(t, srv, 5*time.Second, "no descriptor left")
	restore()
	if !closedByServer(conns[0]) {
		t.Error("the oldest connection without a whole request was not closed for the good request")
	}
	if n := pendingOf(srv); n != k-1 {
		t.Errorf("%d connections pending, want the %d newest", n, k-1)
	}
}

// TestScreenedRefusals: the endpoint answers a TCP request it does not
// pass on — malformed, a header past the limit, no token (HEAD too) —
// itself, with a JSON error (none for HEAD), Connection: close, and then
// closes the connection; with the token the same connection would have
// been served.
func TestScreenedRefusals(t *testing.T) {
	srv := startTCPEndpoint(t)
	addr := srv.Addr()
	for _, tc := range []struct {
		name, raw string
		code      int
	}{
		{"malformed", "GARBAGE\r\n\r\n", http.StatusBadRequest},
		{"header too large", "GET /v1/devices HTTP/1.1\r\nHost: " + addr + "\r\nX-Big: " + strings.Repeat("a", maxHeaderBytes) + "\r\n\r\n", http.StatusRequestHeaderFieldsTooLarge},
		{"no token", "GET /v1/devices HTTP/1.1\r\nHost: " + addr + "\r\n\r\n", http.StatusUnauthorized},
		{"HEAD without token", "HEAD /v1/devices HTTP/1.1\r\nHost: " + addr + "\r\n\r\n", http.StatusUnauthorized},
		{"another Host", "GET /v1/devices HTTP/1.1\r\nHost: evil.example\r\nAuthorization: Bearer " + srv.Token() + "\r\n\r\n", http.StatusForbidden},
	} {
		conn := dialTCP(t, addr)
		conn.SetDeadline(time.Now().Add(10 * time.Second))
		io.WriteString(conn, tc.raw)
		br := bufio.NewReader(conn)
		req := &http.Request{Method: strings.Fields(tc.raw)[0]}
		resp, err := http.ReadResponse(br, req)
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var e errorBody
		switch {
		case resp.StatusCode != tc.code:
			t.Errorf("%s: status %d, want %d", tc.name, resp.StatusCode, tc.code)
		case !resp.Close:
			t.Errorf("%s: no Connection: close", tc.name)
		case req.Method == http.MethodHead && len(body) != 0:
			t.Errorf("%s: a body %q", tc.name, body)
		case req.Method != http.MethodHead && (json.Unmarshal(body, &e) != nil || e.Error == ""):
			t.Errorf("%s: body %q, want a JSON error", tc.name, body)
		case tc.code == http.StatusUnauthorized && resp.Header.Get("WWW-Authenticate") == "":
			t.Errorf("%s: no WWW-Authenticate", tc.name)
		}
		if n, err := br.Read(make([]byte, 1)); n != 0 || err == nil || os.IsTimeout(err) {
			t.Errorf("%s: connection not closed after the answer: %d %v", tc.name, n, err)
		}
	}
}
