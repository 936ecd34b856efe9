package introspect

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/softrdma/softrdma/capture"
)

// This file tests the endpoint's trust model and limits.

// inotifyEvent is one event of an inotify watch.
type inotifyEvent struct {
	mask uint32
	name string
}

// readInotify returns the events queued on a non-blocking inotify fd.
func readInotify(t *testing.T, fd int) []inotifyEvent {
	t.Helper()
	var out []inotifyEvent
	buf := make([]byte, 64<<10)
	for {
		n, err := unix.Read(fd, buf)
		if errors.Is(err, unix.EAGAIN) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		for b := buf[:n]; len(b) >= unix.SizeofInotifyEvent; {
			mask := binary.NativeEndian.Uint32(b[4:8])
			l := int(binary.NativeEndian.Uint32(b[12:16]))
			name := string(bytes.TrimRight(b[16:16+l], "\x00"))
			out = append(out, inotifyEvent{mask, name})
			b = b[16+l:]
		}
	}
}

// TestSocketModeFromStart: under umask 0 the socket's name appears with
// mode 0600 already — its directory sees it created and never sees its
// attributes change (a chmod after bind shows as IN_ATTRIB) — and no
// private name is left behind.
func TestSocketModeFromStart(t *testing.T) {
	dir := t.TempDir()
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if _, err := unix.InotifyAddWatch(fd, dir, unix.IN_CREATE|unix.IN_ATTRIB|unix.IN_MOVED_TO); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "ep.sock")
	for round := range 2 { // the second replaces a stale socket
		old := unix.Umask(0)
		srv, err := Start("unix:" + path)
		unix.Umask(old)
		if err != nil {
			t.Fatal(err)
		}
		var st unix.Stat_t
		if err := unix.Lstat(path, &st); err != nil {
			t.Fatal(err)
		}
		if st.Mode&unix.S_IFMT != unix.S_IFSOCK || st.Mode&0o7777 != 0o600 || int(st.Uid) != os.Geteuid() {
			t.Errorf("round %d: socket mode %o uid %d, want a socket of mode 600 and uid %d", round, st.Mode, st.Uid, os.Geteuid())
		}
		var seen []string
		for _, ev := range readInotify(t, fd) {
			if ev.name != "ep.sock" {
				continue
			}
			seen = append(seen, fmt.Sprintf("%#x", ev.mask))
			if ev.mask&unix.IN_ATTRIB != 0 {
				t.Errorf("round %d: the socket's attributes changed after its name appeared (mask %#x): it was reachable with another mode", round, ev.mask)
			}
		}
		if len(seen) != 1 {
			t.Errorf("round %d: events on the socket's name: %v, want one creation", round, seen)
		}
		ents, _ := os.ReadDir(dir)
		if len(ents) != 1 {
			var names []string
			for _, e := range ents {
				names = append(names, e.Name())
			}
			t.Errorf("round %d: directory holds %v, want only ep.sock", round, names)
		}
		c, err := Dial(srv.Addr())
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Snapshot(ctxT(t)); err != nil {
			t.Error(err)
		}
		c.Close()
		if round == 0 {
			// Leave a stale socket (a file nobody listens on) for round 1.
			srv.Close()
			ln, err := net.Listen("unix", path)
			if err != nil {
				t.Fatal(err)
			}
			ln.(*net.UnixListener).SetUnlinkOnClose(false)
			ln.Close()
			readInotify(t, fd)
			continue
		}
		srv.Close()
		if _, err := os.Lstat(path); err == nil {
			t.Error("socket file left after Close")
		}
	}
}

// helperEnv names what the test binary does when run as a helper process.
const helperEnv = "SOFTRDMA_INTROSPECT_HELPER"

// TestHelperProcess is not a test: it is what a helper process (the test
// binary run again) does: "wait" (until standard input closes), "get PATH"
// (Dial and Snapshot; prints ok or the error), "raw PATH" (one GET
// without the client's checks; prints the status) or "flood NETWORK ADDR
// N" (see flood).
func TestHelperProcess(t *testing.T) {
	args := strings.Fields(os.Getenv(helperEnv))
	if len(args) == 0 {
		t.Skip("only runs as a helper process")
	}
	switch args[0] {
	case "wait":
		io.Copy(io.Discard, os.Stdin)
	case "get":
		c, err := Dial("unix:" + args[1])
		if err == nil {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			_, err = c.Snapshot(ctx)
			cancel()
			c.Close()
		}
		switch {
		case err == nil:
			fmt.Println("ok")
		case errors.Is(err, ErrUntrustedEndpoint):
			fmt.Println("untrusted:", err)
		default:
			fmt.Println("error:", err)
		}
	case "flood":
		n, _ := strconv.Atoi(args[3])
		flood(args[1], args[2], n)
	case "raw":
		conn, err := net.Dial("unix", args[1])
		if err != nil {
			fmt.Println("error:", err)
			break
		}
		conn.SetDeadline(time.Now().Add(10 * time.Second))
		fmt.Fprint(conn, "GET /v1/snapshot HTTP/1.1\r\nHost: softrdma\r\n\r\n")
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			fmt.Println("error:", err)
			break
		}
		fmt.Println("status", resp.StatusCode)
		conn.Close()
	}
	os.Exit(0)
}

// helper starts the test binary as a helper process doing what; uid, when
// not 0, runs it as that user (the binary is copied where that user may
// run it).
func helper(t *testing.T, uid int, what string) *exec.Cmd {
	t.Helper()
	bin := os.Args[0]
	if uid != 0 {
		d := worldDir(t)
		bin = filepath.Join(d, "helper.test")
		b, err := os.ReadFile(os.Args[0])
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(bin, b, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command(bin, "-test.run=^TestHelperProcess$")
	cmd.Env = append(os.Environ(), helperEnv+"="+what)
	if uid != 0 {
		cmd.Dir = filepath.Dir(bin)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(uid)}}
	}
	return cmd
}

// worldDir returns a new directory every user may enter.
func worldDir(t *testing.T) string {
	t.Helper()
	d, err := os.MkdirTemp("", "softrdma-ep-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	if err := os.Chmod(d, 0o755); err != nil {
		t.Fatal(err)
	}
	return d
}

// TestForPIDChecksListener: a socket named for process P but served by
// another process of the same user is refused by ForPID's client.
func TestForPIDChecksListener(t *testing.T) {
	dir := t.TempDir()
	t.Setenv(EnvDir, dir)
	cmd := helper(t, 0, "wait")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	defer stdin.Close()
	victim := cmd.Process.Pid
	// This process squats the victim's socket name.
	srv, err := Start("unix:" + filepath.Join(dir, fmt.Sprintf("softrdma-%d.sock", victim)))
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	c, err := ForPID(victim)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, err = c.Snapshot(ctxT(t))
	if !errors.Is(err, ErrUntrustedEndpoint) || !strings.Contains(err.Error(), fmt.Sprint(os.Getpid())) {
		t.Errorf("snapshot through a squatted socket: %v, want ErrUntrustedEndpoint naming the real listener", err)
	}
	// Its own socket is still read.
	own, err := Start("unix:" + SocketPath(os.Getpid()))
	if err != nil {
		t.Fatal(err)
	}
	defer own.Close()
	c2, err := ForPID(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	if _, err := c2.Snapshot(ctxT(t)); err != nil {
		t.Errorf("own socket: %v", err)
	}
}

// needRoot skips a test that must run processes as another user, unless
// CI=true (where the tests run as root).
func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() == 0 {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("CI runs the tests as root; this one needs it to run a process as another user")
	}
	t.Skip("needs root to run a process as another user (nobody)")
}

// TestForeignUser: another user (nobody) connecting to an endpoint whose
// socket a caller left world-writable is refused by the server (403);
// nobody's client refuses an endpoint served by root; ForPID refuses a
// socket file its process's owner does not own.
func TestForeignUser(t *testing.T) {
	needRoot(t)
	const nobody = 65534
	d := worldDir(t)
	path := filepath.Join(d, "open.sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, 0o777); err != nil {
		t.Fatal(err)
	}
	srv, err := Serve(ln)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	for _, tc := range []struct{ what, want string }{
		{"raw " + path, "status 403"},
		{"get " + path, "untrusted:"},
	} {
		out, err := helper(t, nobody, tc.what).CombinedOutput()
		if err != nil || !strings.HasPrefix(strings.TrimSpace(string(out)), tc.want) {
			t.Errorf("%s as nobody: %v %q, want %q", tc.what, err, out, tc.want)
		}
	}
	// Root itself is served.
	c, err := Dial("unix:" + path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Snapshot(ctxT(t)); err != nil {
		t.Errorf("root: %v", err)
	}
	c.Close()

	// A socket for this process owned by someone else.
	dir := t.TempDir()
	t.Setenv(EnvDir, dir)
	own, err := Start("unix")
	if err != nil {
		t.Fatal(err)
	}
	defer own.Close()
	if err := os.Chown(SocketPath(os.Getpid()), nobody, nobody); err != nil {
		t.Fatal(err)
	}
	if _, err := ForPID(os.Getpid()); !errors.Is(err, ErrUntrustedEndpoint) {
		t.Errorf("ForPID with a socket owned by nobody: %v", err)
	}
	for _, e := range Endpoints() {
		if e.PID == os.Getpid() {
			t.Errorf("Endpoints lists %s, owned by nobody", e.Path)
		}
	}
}

// fakeEndpoint serves h on a Unix socket of this process (so the client's
// checks pass) and returns a client of it.
func fakeEndpoint(t *testing.T, h http.Handler) *Client {
	t.Helper()
	path := filepath.Join(t.TempDir(), "fake.sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: h}
	done := make(chan struct{})
	go func() { defer close(done); hs.Serve(ln) }()
	t.Cleanup(func() { hs.Close(); <-done })
	c, err := Dial("unix:" + path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// pcapHeader is a classic little-endian pcap file header.
func pcapHeader(magic uint32, snaplen uint32, link uint32) []byte {
	b := make([]byte, 24)
	binary.LittleEndian.PutUint32(b[0:], magic)
	binary.LittleEndian.PutUint16(b[4:], 2)
	binary.LittleEndian.PutUint16(b[6:], 4)
	binary.LittleEndian.PutUint32(b[16:], snaplen)
	binary.LittleEndian.PutUint32(b[20:], link)
	return b
}

// pcapRecord is a record header claiming n bytes followed by k of them.
func pcapRecord(n uint32, k int) []byte {
	b := make([]byte, 16+k)
	binary.LittleEndian.PutUint32(b[8:], n)
	binary.LittleEndian.PutUint32(b[12:], n)
	return b
}

// TestClientBoundsAnswers: a hostile or broken endpoint cannot make the
// client read without bound: an answer past MaxAnswer, oversized headers
// and capture streams that are not the bounded pcap asked for are errors.
func TestClientBoundsAnswers(t *testing.T) {
	// The limit lowered from MaxAnswer, to stream less under -race.
	answerLimit = 4 << 20
	t.Cleanup(func() { answerLimit = MaxAnswer })
	big := func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"pid": 1, "x": "`)
		chunk := bytes.Repeat([]byte{'a'}, 1<<20)
		for range answerLimit>>20 + 2 {
			if _, err := w.Write(chunk); err != nil {
				return
			}
		}
		io.WriteString(w, `"}`)
	}
	var capture []byte
	var mu sync.Mutex
	mux := http.NewServeMux()
	mux.HandleFunc("/v1/snapshot", big)
	mux.HandleFunc("/metrics", big)
	mux.HandleFunc("/v1/capture", func(w http.ResponseWriter, _ *http.Request) {
		mu.Lock()
		b := capture
		mu.Unlock()
		w.Write(b)
	})
	c := fakeEndpoint(t, mux)
	if _, err := c.Snapshot(ctxT(t)); !errors.Is(err, ErrAnswerTooLarge) {
		t.Errorf("endless snapshot: %v", err)
	}
	if _, err := c.Metrics(ctxT(t)); !errors.Is(err, ErrAnswerTooLarge) {
		t.Errorf("endless metrics: %v", err)
	}
	hdr := fakeEndpoint(t, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("X-Big", strings.Repeat("h", 100<<10))
		w.Write([]byte("{}"))
	}))
	if _, err := hdr.Snapshot(ctxT(t)); err == nil {
		t.Error("100 KiB of response headers accepted")
	}
	good := append(pcapHeader(0xa1b2c3d4, 65535, 1), pcapRecord(60, 60)...)
	good = append(good, pcapRecord(10, 10)...)
	for _, tc := range []struct {
		name   string
		stream []byte
		count  int
		ok     bool
	}{
		{"two frames", good, 2, true},
		{"any number", good, 0, true},
		{"more than asked", good, 1, false},
		{"not pcap", []byte("<html>hello</html> and some more bytes"), 0, false},
		{"big-endian", pcapHeader(0xd4c3b2a1, 65535, 1), 0, false},
		{"huge snaplen", pcapHeader(0xa1b2c3d4, 1<<31, 1), 0, false},
		{"not Ethernet or InfiniBand", pcapHeader(0xa1b2c3d4, 65535, 101), 0, false},
		{"InfiniBand", append(pcapHeader(0xa1b2c3d4, 65535, 247), pcapRecord(60, 60)...), 1, true},
		{"record past snaplen", append(pcapHeader(0xa1b2c3d4, 65535, 1), pcapRecord(1<<30, 100)...), 0, false},
		{"cut in a frame", append(pcapHeader(0xa1b2c3d4, 65535, 1), pcapRecord(100, 50)...), 0, false},
		{"empty", nil, 0, false},
	} {
		mu.Lock()
		capture = tc.stream
		mu.Unlock()
		var out bytes.Buffer
		n, err := c.Capture(ctxT(t), CaptureRequest{Count: tc.count}, &out, nil)
		if tc.ok && (err != nil || !bytes.Equal(out.Bytes(), tc.stream) || n != int64(len(tc.stream))) {
			t.Errorf("%s: %d bytes, %v", tc.name, n, err)
		}
		if !tc.ok && err == nil {
			t.Errorf("%s: accepted (%d bytes)", tc.name, n)
		}
	}
}

// rawTCP sends one GET with the given Host and Authorization to a TCP
// endpoint and returns the status.
func rawTCP(t *testing.T, addr, host, auth string) int {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	req := "GET /v1/devices HTTP/1.1\r\nHost: " + host + "\r\n"
	if auth != "" {
		req += "Authorization: " + auth + "\r\n"
	}
	fmt.Fprint(conn, req+"\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// TestTCPTokenAndHost: a TCP endpoint serves only requests that carry its
// token and name it in Host; the token comes from SOFTRDMA_DEBUG_TOKEN or
// is made up and printed by FromEnv; Dial sends it from the environment.
func TestTCPTokenAndHost(t *testing.T) {
	t.Setenv(EnvToken, "")
	srv, err := Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	tok, addr := srv.Token(), srv.Addr()
	if len(tok) < 32 {
		t.Fatalf("token %q", tok)
	}
	_, port, _ := net.SplitHostPort(addr)
	bearer := "Bearer " + tok
	for _, tc := range []struct {
		host, auth string
		code       int
	}{
		{addr, "", 401},
		{addr, "Bearer " + strings.Repeat("0", len(tok)), 401},
		{addr, "Basic " + tok, 401},
		{addr, bearer + "x", 401},
		{"evil.example:" + port, bearer, 403},
		{"evil.example", bearer, 403},
		{"127.0.0.1.nip.io:" + port, bearer, 403},
		{"127.0.0.1:1", bearer, 403},
		{"127.0.0.2:" + port, bearer, 403},
		{"[::1]:" + port, bearer, 403},
		{"localhost.:" + port, bearer, 403},
		{addr, bearer, 200},
		{"localhost:" + port, bearer, 200},
		{"LocalHost:" + port, bearer, 200},
	} {
		if code := rawTCP(t, addr, tc.host, tc.auth); code != tc.code {
			t.Errorf("Host %q, Authorization %q: %d, want %d", tc.host, tc.auth, code, tc.code)
		}
	}
	// Dial without the token says what to do; with it, it reads.
	c, err := Dial(addr)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Snapshot(ctxT(t)); err == nil || !strings.Contains(err.Error(), EnvToken) {
		t.Errorf("no token: %v", err)
	}
	c.Close()
	t.Setenv(EnvToken, tok)
	c, err = Dial("http://" + addr)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Snapshot(ctxT(t)); err != nil {
		t.Errorf("token from the environment: %v", err)
	}
	c.Close()
	// A Unix socket needs no token.
	_, uc := startServer(t)
	uc.SetToken("")
	if _, err := uc.Snapshot(ctxT(t)); err != nil {
		t.Errorf("unix: %v", err)
	}

	// The token from the environment, checked; a refused one leaves no
	// listener behind.
	listening := len(listeningInodes(t))
	for _, bad := range []string{"short", strings.Repeat("a", 15), "has space in it 0123456789", strings.Repeat("é", 10)} {
		t.Setenv(EnvToken, bad)
		if s, err := Start("127.0.0.1:0"); err == nil {
			s.Close()
			t.Errorf("token %q accepted", bad)
		}
	}
	if n := len(listeningInodes(t)); n != listening {
		t.Errorf("%d listening sockets after refused tokens, %d before", n, listening)
	}
	t.Setenv(EnvToken, "0123456789abcdef-env")
	s2, err := Start("[::1]:0")
	if err != nil {
		s2, err = Start("127.0.0.1:0")
	}
	if err != nil {
		t.Fatal(err)
	}
	if s2.Token() != "0123456789abcdef-env" {
		t.Errorf("token %q, want the environment's", s2.Token())
	}
	c, _ = Dial(s2.Addr())
	if _, err := c.Snapshot(ctxT(t)); err != nil {
		t.Errorf("%s with the environment's token: %v", s2.Addr(), err)
	}
	c.Close()
	s2.Close()

	// FromEnv prints a made-up token; the printed one works.
	var out bytes.Buffer
	announce = &out
	defer func() { announce = os.Stderr }()
	t.Setenv(EnvToken, "")
	t.Setenv(EnvAddr, "127.0.0.1:0")
	t.Setenv(EnvLog, "")
	stop, err := FromEnv()
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	var a, printed string
	if _, err := fmt.Sscanf(out.String(), "softrdma: introspection endpoint http://%s token %s", &a, &printed); err != nil {
		t.Fatalf("FromEnv printed %q: %v", out.String(), err)
	}
	if code := rawTCP(t, a, a, "Bearer "+printed); code != 200 {
		t.Errorf("printed token: %d", code)
	}
}

// startCapture starts a capture through c and returns once the process
// captures; cancel ends it, and the returned channel gives its error.
func startCapture(t *testing.T, c *Client) (cancel func(), done <-chan error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	started := make(chan struct{})
	ch := make(chan error, 1)
	go func() {
		_, err := c.Capture(ctx, CaptureRequest{}, io.Discard, func() { close(started) })
		ch <- err
	}()
	select {
	case <-started:
	case err := <-ch:
		cancel()
		t.Fatalf("capture did not start: %v", err)
	}
	return cancel, ch
}

// TestCaptureLimit: a process streams at most MaxCaptures captures; one
// more gets 503 with a message saying so, and a slot freed by a capture
// ending is taken again.
func TestCaptureLimit(t *testing.T) {
	_, c := startServer(t)
	var cancels []func()
	var dones []<-chan error
	for range MaxCaptures {
		cancel, done := startCapture(t, c)
		cancels, dones = append(cancels, cancel), append(dones, done)
	}
	_, err := c.Capture(ctxT(t), CaptureRequest{}, io.Discard, func() { t.Error("capture past the limit started") })
	if err == nil || !strings.Contains(err.Error(), "503") || !strings.Contains(err.Error(), fmt.Sprintf("already streams %d captures", MaxCaptures)) {
		t.Errorf("capture past the limit: %v", err)
	}
	cancels[0]()
	if err := <-dones[0]; err != nil {
		t.Error(err)
	}
	// The slot is freed once the handler returns: wait for it.
	deadline := time.Now().Add(10 * time.Second)
	for len(captureSlots) == MaxCaptures && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	cancel, done := startCapture(t, c)
	cancels, dones = append(cancels[1:], cancel), append(dones[1:], done)
	for i, cancel := range cancels {
		cancel()
		if err := <-dones[i]; err != nil {
			t.Error(err)
		}
	}
}

// smallBufListener gives every accepted Unix connection a small send
// buffer, so that a client that stops reading stalls the server soon.
type smallBufListener struct{ net.Listener }

func (l smallBufListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		c.(*net.UnixConn).SetWriteBuffer(4096)
	}
	return c, err
}

// TestCaptureStalledReader: a client that asks for a capture and stops
// reading ends its capture (and frees its slot) within the write timeout
// once the stream backs up.
func TestCaptureStalledReader(t *testing.T) {
	s := newScenario(t)
	old := captureWriteTimeout
	captureWriteTimeout = 300 * time.Millisecond
	t.Cleanup(func() { captureWriteTimeout = old })
	path := filepath.Join(t.TempDir(), "ep.sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := Serve(smallBufListener{ln})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	conn, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.(*net.UnixConn).SetReadBuffer(4096)
	fmt.Fprint(conn, "GET /v1/capture?dir=sent HTTP/1.1\r\nHost: softrdma\r\n\r\n")
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReaderSize(conn, 16)
	for {
		l, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("response header: %v", err)
		}
		if l == "\r\n" {
			break
		}
	}
	if capture.Active(nil) != 1 {
		t.Fatalf("%d captures running", capture.Active(nil))
	}
	// Stop reading; send until the capture gives up.
	deadline := time.Now().Add(20 * time.Second)
	for capture.Active(nil) != 0 && time.Now().Before(deadline) {
		s.sendOnly.send(t, 50, 0)
	}
	if capture.Active(nil) != 0 {
		t.Fatal("a capture whose client stopped reading still runs")
	}
	for len(captureSlots) != 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if len(captureSlots) != 0 {
		t.Errorf("%d capture slots still taken", len(captureSlots))
	}
	// The server closed the stalled connection: reading drains to its end.
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.Copy(io.Discard, br); err != nil {
		t.Errorf("stalled connection not closed by the server: %v", err)
	}
}

// TestConnectionLimit: the endpoint's listener hands out at most its
// limit of connections at once; one more waits until a connection that is
// being served closes, and, while it waits, the connections that hold a
// slot without a request (connected longer than slowRequest, or idle
// between requests) are closed to make room — busy ones never are.
func TestConnectionLimit(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := newLimitListener(ln, 2)
	defer l.Close()
	accept := func() <-chan net.Conn {
		ch := make(chan net.Conn, 1)
		go func() {
			c, err := l.Accept()
			if err == nil {
				ch <- c
			}
			close(ch)
		}()
		return ch
	}
	var clients []net.Conn
	defer func() {
		for _, c := range clients {
			c.Close()
		}
	}()
	dial := func() {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		clients = append(clients, c)
	}
	var served []net.Conn
	for range 2 {
		dial()
		c := <-accept()
		l.connState(c, http.StateNew)
		l.connState(c, http.StateActive) // a request being served
		served = append(served, c)
	}
	dial()
	third := accept()
	select {
	case <-third:
		t.Fatal("a third connection accepted while two are being served")
	case <-time.After(3 * slowRequest):
	}
	// One being served closes: the third gets its slot.
	served[0].Close()
	l.connState(served[0], http.StateClosed)
	c := <-third
	if c == nil {
		t.Fatal("no third connection after one closed")
	}
	l.connState(c, http.StateNew) // connected, no request yet
	go func() {
		// The server's part: reading the request, and the end of the
		// connection when the read fails.
		io.Copy(io.Discard, c)
		l.connState(c, http.StateClosed)
	}()
	// A fourth waits; the third, which sends no request, loses its slot.
	dial()
	fourth := accept()
	select {
	case c4 := <-fourth:
		if c4 == nil {
			t.Fatal("Accept failed")
		}
		c4.Close()
	case <-time.After(10 * time.Second):
		t.Fatal("a connection without a request kept its slot from a waiting one")
	}
	if _, err := c.Write([]byte("x")); err == nil {
		t.Fatal("the connection without a request was not closed")
	}
}

// TestSocketPathTooLong: a path the socket address cannot hold, or whose
// private name next to it would not fit, is a clear error and leaves
// nothing behind.
func TestSocketPathTooLong(t *testing.T) {
	dir := t.TempDir()
	// A directory whose name brings a one-letter socket name to exactly
	// the limit: the socket's path fits, its private name does not.
	sub := filepath.Join(dir, strings.Repeat("d", maxSunPath-len(dir)-3))
	if err := os.Mkdir(sub, 0o700); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{filepath.Join(dir, strings.Repeat("x", 120)), filepath.Join(sub, "a")} {
		if srv, err := Start("unix:" + path); !errors.Is(err, syscall.ENAMETOOLONG) {
			if err == nil {
				srv.Close()
			}
			t.Errorf("%d-byte path: %v, want ENAMETOOLONG", len(path), err)
		}
	}
	for _, d := range []string{dir, sub} {
		if ents, _ := os.ReadDir(d); len(ents) != map[string]int{dir: 1, sub: 0}[d] {
			t.Errorf("left behind in %s: %v", d, ents)
		}
	}
}

// TestCaptureIdleEnd: a capture that idles past the write timeout (no
// frames) still ends cleanly at its duration: the client gets the pcap
// header and no error.
func TestCaptureIdleEnd(t *testing.T) {
	old := captureWriteTimeout
	captureWriteTimeout = 100 * time.Millisecond
	t.Cleanup(func() { captureWriteTimeout = old })
	_, c := startServer(t)
	var out bytes.Buffer
	n, err := c.Capture(ctxT(t), CaptureRequest{Direction: capture.Received, Snaplen: 64, Duration: 500 * time.Millisecond}, &out, nil)
	if err != nil || n != 24 {
		t.Errorf("idle capture: %d bytes, %v; want the 24-byte header and no error", n, err)
	}
}

// TestHostMatches: the Host values a TCP endpoint accepts, IPv4 and IPv6,
// with and without the default port.
func TestHostMatches(t *testing.T) {
	for _, tc := range []struct {
		addr string
		yes  []string
		no   []string
	}{
		{"127.0.0.1:4000", []string{"127.0.0.1:4000", "localhost:4000", "LOCALHOST:4000"},
			[]string{"", "127.0.0.1", "localhost", "[127.0.0.1]:4000", "[localhost]:4000", "127.0.0.1:04000", "127.0.0.1:4000.", "evil:4000", "127.0.0.1:4000\x00"}},
		{"[::1]:4000", []string{"[::1]:4000", "localhost:4000"},
			[]string{"::1:4000", "[::1]", "[0:0::1]:4000", "[::1%lo]:4000", "127.0.0.1:4000"}},
		{"127.0.0.1:80", []string{"127.0.0.1:80", "127.0.0.1", "localhost", "localhost:80"}, []string{"127.0.0.1:8080", "[127.0.0.1]"}},
		{"[::1]:80", []string{"[::1]:80", "[::1]", "localhost"}, []string{"::1", "[::1]:8080"}},
	} {
		for _, h := range tc.yes {
			if !hostMatches(h, tc.addr) {
				t.Errorf("%s: Host %q refused", tc.addr, h)
			}
		}
		for _, h := range tc.no {
			if hostMatches(h, tc.addr) {
				t.Errorf("%s: Host %q accepted", tc.addr, h)
			}
		}
	}
}

// startTCPEndpoint starts an endpoint on 127.0.0.1 with a made-up token.
func startTCPEndpoint(t *testing.T) *Server {
	t.Helper()
	t.Setenv(EnvToken, "")
	srv, err := Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	return srv
}

// dialTCP opens a connection to addr, closed when the test ends.
func dialTCP(t *testing.T, addr string) net.Conn {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// goodRequestWithin sends a request with the token and fails the test
// unless it is answered 200 within d; behind says what it queued behind.
func goodRequestWithin(t *testing.T, srv *Server, d time.Duration, behind string) {
	t.Helper()
	start := time.Now()
	conn := dialTCP(t, srv.Addr())
	conn.SetDeadline(time.Now().Add(d))
	fmt.Fprintf(conn, "GET /v1/devices HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\n\r\n", srv.Addr(), srv.Token())
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("a good request behind %s: %v after %v", behind, err, time.Since(start))
	}
	resp.Body.Close()
	conn.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("a good request behind %s: status %d", behind, resp.StatusCode)
	}
}

// TestSlowBodiesDoNotLockOut: requests that announce a body and never
// send it (20 of them, more than MaxConns) get their answer and their
// connection closed at once — the endpoint never waits for a body it will
// not read — so a request with the token is answered within a second.
func TestSlowBodiesDoNotLockOut(t *testing.T) {
	srv := startTCPEndpoint(t)
	addr := srv.Addr()
	const slow = 20
	closed := make(chan error, slow)
	for i := range slow {
		conn := dialTCP(t, addr)
		auth := ""
		if i%2 == 1 {
			auth = "Authorization: Bearer " + srv.Token() + "\r\n" // authorized, but a body it will not read
		}
		fmt.Fprintf(conn, "POST /v1/devices HTTP/1.1\r\nHost: %s\r\n%sContent-Length: 100000\r\n\r\n", addr, auth)
		go func() {
			// The answer, then the end of the connection.
			conn.SetDeadline(time.Now().Add(10 * time.Second))
			_, err := io.Copy(io.Discard, conn)
			closed <- err
		}()
	}
	goodRequestWithin(t, srv, time.Second, fmt.Sprintf("%d requests with unsent bodies", slow))
	for range slow {
		if err := <-closed; err != nil {
			t.Fatalf("a connection with an unread body was not closed: %v", err)
		}
	}
}

// TestSlowClientsDoNotLockOut: connections that hold a slot without using
// it — half a request sent and nothing more, or idle after an answer —
// more of them than MaxConns, lose their slots to a request with the
// token, which is answered within a second.
func TestSlowClientsDoNotLockOut(t *testing.T) {
	srv := startTCPEndpoint(t)
	addr := srv.Addr()
	for _, kind := range []string{"half a request", "idle after an answer"} {
		for range MaxConns + 4 {
			conn := dialTCP(t, addr)
			if kind == "half a request" {
				fmt.Fprintf(conn, "GET /v1/devices HTTP/1.1\r\nHost: %s\r\n", addr)
				continue
			}
			// An unauthorized request (401) on a connection kept alive,
			// read in the background (the client does not close it).
			fmt.Fprintf(conn, "GET /v1/devices HTTP/1.1\r\nHost: %s\r\n\r\n", addr)
			go io.Copy(io.Discard, conn)
		}
		goodRequestWithin(t, srv, time.Second, fmt.Sprintf("%d connections with %s", MaxConns+4, kind))
	}
}
