package introspect

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Client reads a process's endpoint (what the softrdma subcommands use).
type Client struct {
	target string
	hc     *http.Client
	tr     *http.Transport
}

// Dial returns a client of the endpoint at addr, in the forms Start takes
// ("unix:PATH", "/PATH", "127.0.0.1:PORT"; an "http://" prefix is allowed
// for TCP). Like Start, it refuses addresses off the machine. It does not
// connect yet.
func Dial(addr string) (*Client, error) {
	addr = strings.TrimPrefix(addr, "http://")
	addr = strings.TrimSuffix(addr, "/")
	if addr == "unix" || addr == "1" || addr == "on" {
		return nil, fmt.Errorf("introspect: %q names this process's own socket; give a path or use ForPID", addr)
	}
	network, a, err := ParseAddr(addr)
	if err != nil {
		return nil, err
	}
	d := net.Dialer{Timeout: 5 * time.Second}
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return d.DialContext(ctx, network, a)
		},
		DisableCompression:    true,
		ResponseHeaderTimeout: 30 * time.Second,
		MaxIdleConns:          2,
		IdleConnTimeout:       10 * time.Second,
	}
	target := a
	if network == "unix" {
		target = "unix:" + a
	}
	return &Client{target: target, tr: tr, hc: &http.Client{Transport: tr}}, nil
}

// Target returns the endpoint's address ("unix:PATH" or "HOST:PORT").
func (c *Client) Target() string { return c.target }

// Close releases idle connections.
func (c *Client) Close() { c.tr.CloseIdleConnections() }

// ErrNoEndpoint reports that no endpoint was found for a process.
var ErrNoEndpoint = errors.New("no introspection endpoint")

// socketDirs are the directories ForPID and Endpoints search: this
// process's $XDG_RUNTIME_DIR, /run/user/<uid> of the process's owner, /tmp.
func socketDirs(uid int) []string {
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
// $XDG_RUNTIME_DIR, /run/user/<uid of the process> and /tmp.
func ForPID(pid int) (*Client, error) {
	if pid <= 0 {
		return nil, fmt.Errorf("introspect: pid %d: %w", pid, syscall.EINVAL)
	}
	name := fmt.Sprintf("softrdma-%d.sock", pid)
	var tried []string
	for _, d := range socketDirs(processUID(pid)) {
		p := filepath.Join(d, name)
		tried = append(tried, p)
		if fi, err := os.Stat(p); err == nil && fi.Mode()&os.ModeSocket != 0 {
			return Dial("unix:" + p)
		}
	}
	if processUID(pid) < 0 {
		return nil, fmt.Errorf("introspect: no process %d: %w", pid, ErrNoEndpoint)
	}
	return nil, fmt.Errorf("introspect: process %d (tried %s; start it with %s=unix): %w",
		pid, strings.Join(tried, ", "), EnvAddr, ErrNoEndpoint)
}

// Endpoint is a per-process socket found by Endpoints.
type Endpoint struct {
	PID  int
	Path string
}

// Endpoints lists the per-process sockets of live processes in the
// directories ForPID searches (the current user's), by PID.
func Endpoints() []Endpoint {
	var out []Endpoint
	seen := map[int]bool{}
	for _, d := range socketDirs(os.Getuid()) {
		ms, _ := filepath.Glob(filepath.Join(d, "softrdma-*.sock"))
		for _, p := range ms {
			s := strings.TrimSuffix(strings.TrimPrefix(filepath.Base(p), "softrdma-"), ".sock")
			pid, err := strconv.Atoi(s)
			if err != nil || pid <= 0 || seen[pid] || processUID(pid) < 0 {
				continue
			}
			if fi, err := os.Stat(p); err != nil || fi.Mode()&os.ModeSocket == 0 {
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
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://softrdma"+path, nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("introspect: %s: %w", c.target, err)
	}
	if resp.StatusCode != http.StatusOK {
		defer resp.Body.Close()
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
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
	defer resp.Body.Close()
	var s Snapshot
	if err := json.NewDecoder(resp.Body).Decode(&s); err != nil {
		return nil, fmt.Errorf("introspect: %s: snapshot: %w", c.target, err)
	}
	return &s, nil
}

// Metrics fetches GET /metrics (Prometheus text format).
func (c *Client) Metrics(ctx context.Context) ([]byte, error) {
	resp, err := c.get(ctx, "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	return io.ReadAll(resp.Body)
}

// Capture streams GET /v1/capture into w until the capture ends (count or
// duration reached), ctx is done or the endpoint closes; it returns the
// number of bytes written. started, when not nil, is called once the
// process has started capturing. A capture that ends because ctx is done
// returns no error.
func (c *Client) Capture(ctx context.Context, r CaptureRequest, w io.Writer, started func()) (int64, error) {
	path := "/v1/capture"
	if q := r.query(); q != "" {
		path += "?" + q
	}
	resp, err := c.get(ctx, path)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if started != nil {
		started()
	}
	n, err := io.Copy(w, resp.Body)
	if err != nil && ctx.Err() != nil {
		err = nil
	}
	return n, err
}
