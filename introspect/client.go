package introspect

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Client reads a process's endpoint (what the softrdma subcommands use).
// It trusts only what it checked: on a Unix socket the process listening
// (SO_PEERCRED) must be the one asked for (ForPID) or, for a path, run as
// this user (any user when this one is root); every answer is bounded
// (MaxAnswer, pcap records of at most 262144 bytes).
type Client struct {
	target string
	host   string // the Host of requests: the TCP address, or "softrdma"
	token  string // sent to a TCP endpoint
	hc     *http.Client
	tr     *http.Transport
}

// MaxAnswer is the largest answer other than a capture stream a Client
// reads (a snapshot, the metrics, an error); a larger one is an error
// wrapping ErrAnswerTooLarge.
const MaxAnswer = 64 << 20

// answerLimit is MaxAnswer; tests lower it to stream less.
var answerLimit int64 = MaxAnswer

// Errors of a Client.
var (
	// ErrUntrustedEndpoint reports a Unix socket served by a process other
	// than the one asked for, or by another user.
	ErrUntrustedEndpoint = errors.New("endpoint served by another process or user")
	// ErrAnswerTooLarge reports an answer past MaxAnswer, or a capture
	// stream that is not the bounded pcap asked for.
	ErrAnswerTooLarge = errors.New("answer too large or malformed")
)

// Dial returns a client of the endpoint at addr, in the forms Start takes
// ("unix:PATH", "/PATH", "127.0.0.1:PORT"; an "http://" prefix is allowed
// for TCP). Like Start, it refuses addresses off the machine. It does not
// connect yet. A Unix socket must be served by a process of this user
// (any, when this user is root); a TCP endpoint is sent the token in
// SOFTRDMA_DEBUG_TOKEN (see SetToken).
func Dial(addr string) (*Client, error) {
	addr = strings.TrimPrefix(addr, "http://")
	addr = strings.TrimSuffix(addr, "/")
	if addr == "unix" || addr == "1" || addr == "on" {
		return nil, fmt.Errorf("introspect: %q names this process's own socket; give a path or use ForPID", addr)
	}
	return dial(addr, 0)
}

// dial returns a client of addr; pid, when not 0, is the process that
// must be listening on a Unix socket.
func dial(addr string, pid int) (*Client, error) {
	network, a, err := ParseAddr(addr)
	if err != nil {
		return nil, err
	}
	c := &Client{target: a, host: a, token: os.Getenv(EnvToken)}
	if network == "unix" {
		c.target, c.host = "unix:"+a, "softrdma"
	}
	d := net.Dialer{Timeout: 5 * time.Second}
	c.tr = &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			conn, err := d.DialContext(ctx, network, a)
			if err != nil || network != "unix" {
				return conn, err
			}
			if err := checkPeer(conn, a, pid); err != nil {
				conn.Close()
				return nil, err
			}
			return conn, nil
		},
		DisableCompression:     true,
		ResponseHeaderTimeout:  30 * time.Second,
		MaxResponseHeaderBytes: 64 << 10,
		MaxIdleConns:           2,
		IdleConnTimeout:        10 * time.Second,
	}
	c.hc = &http.Client{Transport: c.tr}
	return c, nil
}

// checkPeer checks who listens on the Unix socket at path: process pid
// under its owner's uid when pid is not 0, else a process of this user (of
// anyone when this user is root).
func checkPeer(conn net.Conn, path string, pid int) error {
	cred, err := peerCred(conn)
	if err != nil {
		return fmt.Errorf("introspect: unix:%s: cannot tell who serves it: %v: %w", path, err, ErrUntrustedEndpoint)
	}
	if pid != 0 {
		uid := processUID(pid)
		if int(cred.Pid) != pid || int(cred.Uid) != uid {
			return fmt.Errorf("introspect: unix:%s is served by process %d (uid %d), not process %d (uid %d): %w",
				path, cred.Pid, cred.Uid, pid, uid, ErrUntrustedEndpoint)
		}
		return nil
	}
	if euid := os.Geteuid(); euid != 0 && int(cred.Uid) != euid {
		return fmt.Errorf("introspect: unix:%s is served by process %d of uid %d, not of this user (uid %d): %w",
			path, cred.Pid, cred.Uid, euid, ErrUntrustedEndpoint)
	}
	return nil
}

// SetToken sets the token sent to a TCP endpoint (Dial takes it from
// SOFTRDMA_DEBUG_TOKEN).
func (c *Client) SetToken(token string) { c.token = token }

// Target returns the endpoint's address ("unix:PATH" or "HOST:PORT").
func (c *Client) Target() string { return c.target }

// Close releases idle connections.
func (c *Client) Close() { c.tr.CloseIdleConnections() }

// ErrNoEndpoint reports that no endpoint was found for a process.
var ErrNoEndpoint = errors.New("no introspection endpoint")

// socketDirs are the directories ForPID and Endpoints search: this
// process's $XDG_RUNTIME_DIR, /run/user/<uid> of the process's owner, /tmp.
func socketDirs(uid int) []string {
	if d := os.Getenv(EnvDir); d != "" {
		return []string{d}
	}
	var dirs []string
	if d := os.Getenv("XDG_RUNTIME_DIR"); d != "" {
		dirs = append(dirs, d)
	}
	if uid >= 0 {
		dirs = append(dirs, fmt.Sprintf("/run/user/%d", uid))
	}
	dirs = append(dirs, "/tmp")
	out := dirs[:0]
	for _, d := range dirs {
		if !slices.Contains(out, d) {
			out = append(out, d)
		}
	}
	return out
}

// processUID returns the owner of process pid, or -1.
func processUID(pid int) int {
	var st syscall.Stat_t
	if err := syscall.Stat("/proc/"+strconv.Itoa(pid), &st); err != nil {
		return -1
	}
	return int(st.Uid)
}

// ForPID returns a client of the per-process socket of process pid (an
// endpoint started with SOFTRDMA_DEBUG_ADDR=unix), looking in
// $XDG_RUNTIME_DIR, /run/user/<uid of the process> and /tmp for a socket
// file owned by the process's owner. On connecting, the client checks
// that process pid is the one listening (else ErrUntrustedEndpoint).
func ForPID(pid int) (*Client, error) {
	if pid <= 0 {
		return nil, fmt.Errorf("introspect: pid %d: %w", pid, syscall.EINVAL)
	}
	uid := processUID(pid)
	if uid < 0 {
		return nil, fmt.Errorf("introspect: no process %d: %w", pid, ErrNoEndpoint)
	}
	name := fmt.Sprintf("softrdma-%d.sock", pid)
	var tried, foreign []string
	for _, d := range socketDirs(uid) {
		p := filepath.Join(d, name)
		tried = append(tried, p)
		if owner, ok := socketOwner(p); ok {
			if owner != uid {
				foreign = append(foreign, fmt.Sprintf("%s (owned by uid %d)", p, owner))
				continue
			}
			return dial("unix:"+p, pid)
		}
	}
	if len(foreign) > 0 {
		return nil, fmt.Errorf("introspect: process %d runs as uid %d, but %s: %w", pid, uid, strings.Join(foreign, ", "), ErrUntrustedEndpoint)
	}
	return nil, fmt.Errorf("introspect: process %d (tried %s; start it with %s=unix): %w",
		pid, strings.Join(tried, ", "), EnvAddr, ErrNoEndpoint)
}

// socketOwner returns the owner of the socket file at p (ok false when p
// is not a socket).
func socketOwner(p string) (uid int, ok bool) {
	var st syscall.Stat_t
	if err := syscall.Stat(p, &st); err != nil || st.Mode&syscall.S_IFMT != syscall.S_IFSOCK {
		return -1, false
	}
	return int(st.Uid), true
}

// Endpoint is a per-process socket found by Endpoints.
type Endpoint struct {
	PID  int
	Path string
}

// Endpoints lists the per-process sockets of live processes of this user
// in the directories ForPID searches, by PID: sockets owned by the
// process's owner, who is this user (any user when this one is root).
func Endpoints() []Endpoint {
	var out []Endpoint
	seen := map[int]bool{}
	euid := os.Geteuid()
	for _, d := range socketDirs(os.Getuid()) {
		ms, _ := filepath.Glob(filepath.Join(d, "softrdma-*.sock"))
		for _, p := range ms {
			s := strings.TrimSuffix(strings.TrimPrefix(filepath.Base(p), "softrdma-"), ".sock")
			pid, err := strconv.Atoi(s)
			if err != nil || pid <= 0 || seen[pid] {
				continue
			}
			uid := processUID(pid)
			if owner, ok := socketOwner(p); uid < 0 || !ok || owner != uid || (euid != 0 && uid != euid) {
				continue
			}
			seen[pid] = true
			out = append(out, Endpoint{PID: pid, Path: p})
		}
	}
	slices.SortFunc(out, func(a, b Endpoint) int { return a.PID - b.PID })
	return out
}

// get performs a GET and returns the response of a 200, else an error
// carrying the endpoint's message.
func (c *Client) get(ctx context.Context, path string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+c.host+path, nil)
	if err != nil {
		return nil, err
	}
	if c.token != "" && !strings.HasPrefix(c.target, "unix:") {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return nil, fmt.Errorf("introspect: %s: %w", c.target, err)
	}
	if resp.StatusCode != http.StatusOK {
		defer resp.Body.Close()
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		if resp.StatusCode == http.StatusUnauthorized && c.token == "" {
			return nil, fmt.Errorf("introspect: %s: %s: set %s to the token the process printed or was started with", c.target, resp.Status, EnvToken)
		}
		var e errorBody
		if json.Unmarshal(b, &e) == nil && e.Error != "" {
			return nil, fmt.Errorf("introspect: %s: %s: %s", c.target, resp.Status, e.Error)
		}
		return nil, fmt.Errorf("introspect: %s: %s: %s", c.target, resp.Status, strings.TrimSpace(string(b)))
	}
	return resp, nil
}

// Snapshot fetches GET /v1/snapshot.
func (c *Client) Snapshot(ctx context.Context) (*Snapshot, error) {
	resp, err := c.get(ctx, "/v1/snapshot")
	if err != nil {
		return nil, err
	}
	b, err := c.readAnswer(resp, "snapshot")
	if err != nil {
		return nil, err
	}
	var s Snapshot
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("introspect: %s: snapshot: %w", c.target, err)
	}
	return &s, nil
}

// readAnswer reads and closes a response body of at most MaxAnswer bytes.
func (c *Client) readAnswer(resp *http.Response, what string) ([]byte, error) {
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, answerLimit+1))
	if err != nil {
		return nil, fmt.Errorf("introspect: %s: %s: %w", c.target, what, err)
	}
	if int64(len(b)) > answerLimit {
		return nil, fmt.Errorf("introspect: %s: %s larger than %d bytes: %w", c.target, what, answerLimit, ErrAnswerTooLarge)
	}
	return b, nil
}

// Metrics fetches GET /metrics (Prometheus text format).
func (c *Client) Metrics(ctx context.Context) ([]byte, error) {
	resp, err := c.get(ctx, "/metrics")
	if err != nil {
		return nil, err
	}
	return c.readAnswer(resp, "metrics")
}

// Capture streams GET /v1/capture into w until the capture ends (count or
// duration reached), ctx is done or the endpoint closes; it returns the
// number of bytes written. started, when not nil, is called once the
// process has started capturing. A capture that ends because ctx is done
// returns no error. The stream must be the pcap asked for (see pcapGuard);
// a capture with a duration that goes on 10s past it is an error.
func (c *Client) Capture(ctx context.Context, r CaptureRequest, w io.Writer, started func()) (int64, error) {
	path := "/v1/capture"
	if q := r.query(); q != "" {
		path += "?" + q
	}
	outer := ctx
	if r.Duration > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, r.Duration+captureGrace)
		defer cancel()
	}
	resp, err := c.get(ctx, path)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if started != nil {
		started()
	}
	g := &pcapGuard{w: w, frames: r.Count}
	n, err := io.Copy(g, resp.Body)
	switch {
	case err == nil && g.broken():
		err = fmt.Errorf("introspect: %s: capture stream ends before its pcap header or inside a frame: %w", c.target, io.ErrUnexpectedEOF)
	case errors.Is(err, ErrAnswerTooLarge):
		err = fmt.Errorf("introspect: %s: capture: %w", c.target, err)
	case err != nil && outer.Err() != nil:
		err = nil
	case err != nil && ctx.Err() != nil:
		err = fmt.Errorf("introspect: %s: capture of %v still running %v later: ended", c.target, r.Duration, captureGrace)
	}
	return n, err
}
