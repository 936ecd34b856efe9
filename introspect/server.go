package introspect

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/softrdma/softrdma/capture"
	"github.com/softrdma/softrdma/verbs"
)

// EnvAddr is the environment variable FromEnv reads to turn the endpoint
// on; see Start for its values.
const EnvAddr = "SOFTRDMA_DEBUG_ADDR"

// EnvDir is the environment variable that, set, names the only directory
// where the per-process sockets are made (Start with "unix") and looked
// for (ForPID, Endpoints): a test suite, or a user running several
// independent sets of processes, scopes the tools to its own processes.
const EnvDir = "SOFTRDMA_DEBUG_DIR"

// SocketPath returns the per-process socket path Start uses for the
// address "unix": $SOFTRDMA_DEBUG_DIR/softrdma-<pid>.sock when that is
// set, else $XDG_RUNTIME_DIR/softrdma-<pid>.sock when XDG_RUNTIME_DIR
// names a directory, else /tmp/softrdma-<pid>.sock.
func SocketPath(pid int) string {
	return filepath.Join(socketDir(), fmt.Sprintf("softrdma-%d.sock", pid))
}

func socketDir() string {
	if d := os.Getenv(EnvDir); d != "" {
		return d
	}
	if d := os.Getenv("XDG_RUNTIME_DIR"); d != "" {
		if fi, err := os.Stat(d); err == nil && fi.IsDir() {
			return d
		}
	}
	return "/tmp"
}

// Server is a running introspection endpoint.
type Server struct {
	network, addr string
	token         string // TCP: what requests must carry
	tokenFromEnv  bool   // the token came from SOFTRDMA_DEBUG_TOKEN
	ln            net.Listener
	srv           *http.Server
	ctx           context.Context
	cancel        context.CancelFunc
	handlers      sync.WaitGroup // requests in flight (captures stream long)
	served        chan struct{}
	closeOnce     sync.Once
	closeErr      error
}

// Start turns the endpoint on. addr is one of
//
//	unix (or 1, on)       the per-process Unix socket SocketPath(os.Getpid())
//	unix:PATH, /PATH      a Unix socket at PATH
//	127.0.0.1:PORT        loopback TCP (also [::1]:PORT, localhost:PORT; port 0 picks one)
//
// Any other host is refused: the endpoint never listens off the machine.
// A Unix socket has mode 0600 from the moment its name exists (it is bound
// in a private directory and linked into place); a stale socket file
// (nobody listening) is replaced, a live one gives EADDRINUSE, any other
// file EEXIST. Only processes of this process's effective uid (or root)
// are served on it. A TCP endpoint serves only requests whose Host names
// it and that carry its token (see Token and SOFTRDMA_DEBUG_TOKEN). The
// endpoint serves HTTP: GET / lists the paths.
func Start(addr string) (*Server, error) {
	network, a, err := ParseAddr(addr)
	if err != nil {
		return nil, err
	}
	var ln net.Listener
	if network == "unix" {
		ln, err = listenUnix(a)
	} else {
		ln, err = net.Listen("tcp", a)
	}
	if err != nil {
		return nil, fmt.Errorf("introspect: listen %s %s: %w", network, a, err)
	}
	s, err := Serve(ln)
	if err != nil {
		ln.Close()
		return nil, err
	}
	return s, nil
}

// Serve serves the endpoint on a listener the caller opened (which
// should not be reachable from other machines); Close closes it. On a
// Unix listener only peers of this process's effective uid or root are
// served; on any other listener a request needs the token (taken from
// SOFTRDMA_DEBUG_TOKEN, else made up: see Token) and a Host header naming
// the listener. Connections are accepted as they come: one that is not
// trusted from the start (TCP, or a Unix peer of another uid) is served
// only once its request header has arrived whole and passed those checks
// (any other request is answered with its error and the connection
// closed); the oldest of these is closed when too many are open. At most
// MaxConns trusted connections are served at once; more wait, and while
// they wait the ones that hold a slot without a request are closed. On an
// error ln stays open.
func Serve(ln net.Listener) (*Server, error) {
	s := &Server{network: ln.Addr().Network(), addr: ln.Addr().String(), served: make(chan struct{})}
	if s.network != "unix" {
		var err error
		if s.token, s.tokenFromEnv, err = tokenFromEnv(); err != nil {
			return nil, err
		}
	}
	lim := newLimitListener(newGate(s, ln), MaxConns)
	s.ln = lim
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.srv = &http.Server{
		Handler:           s.track(noBody(s.guard(Handler()))),
		ReadHeaderTimeout: 10 * time.Second,
		WriteTimeout:      responseWriteTimeout,
		IdleTimeout:       60 * time.Second,
		MaxHeaderBytes:    16 << 10,
		BaseContext:       func(net.Listener) context.Context { return s.ctx },
		ConnContext:       connContext,
		ConnState:         lim.connState,
		ErrorLog:          log.New(io.Discard, "", 0),
	}
	go func() {
		defer close(s.served)
		s.srv.Serve(lim)
	}()
	return s, nil
}

// Token returns the token requests to a TCP endpoint must carry
// ("Authorization: Bearer TOKEN", what Dial sends from
// SOFTRDMA_DEBUG_TOKEN); "" for a Unix socket.
func (s *Server) Token() string { return s.token }

// ParseAddr checks an endpoint address (see Start) and returns its network
// ("unix" or "tcp") and address. A TCP address must name a loopback IP or
// "localhost" (which means 127.0.0.1).
func ParseAddr(addr string) (network, address string, err error) {
	switch {
	case addr == "unix" || addr == "1" || addr == "on":
		return "unix", SocketPath(os.Getpid()), nil
	case strings.HasPrefix(addr, "unix:"):
		p := strings.TrimPrefix(addr, "unix:")
		if p == "" {
			return "", "", fmt.Errorf("introspect: %q: empty socket path", addr)
		}
		return "unix", p, nil
	case strings.HasPrefix(addr, "/") || strings.HasPrefix(addr, "./"):
		return "unix", addr, nil
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", "", fmt.Errorf("introspect: address %q: want unix, unix:PATH or 127.0.0.1:PORT", addr)
	}
	if host == "localhost" {
		host = "127.0.0.1"
	}
	ip, err := netip.ParseAddr(host)
	if err != nil || !ip.Unmap().IsLoopback() || ip.Zone() != "" {
		return "", "", fmt.Errorf("introspect: address %q: only loopback addresses (127.0.0.0/8, ::1) or a Unix socket", addr)
	}
	if n, err := strconv.ParseUint(port, 10, 16); err != nil || (n == 0 && port != "0") {
		return "", "", fmt.Errorf("introspect: address %q: bad port", addr)
	}
	return "tcp", net.JoinHostPort(ip.Unmap().String(), port), nil
}

// Addr returns the endpoint's address in the form Start and Dial take:
// "unix:PATH" or "127.0.0.1:PORT".
func (s *Server) Addr() string {
	if s.network == "unix" {
		return "unix:" + s.addr
	}
	return s.addr
}

// Close stops the endpoint: it closes the listener (removing a Unix
// socket file) and every connection, ends running captures, and waits for
// the requests in flight.
func (s *Server) Close() error {
	s.closeOnce.Do(func() {
		s.cancel()
		s.closeErr = s.srv.Close()
		<-s.served
		s.handlers.Wait()
	})
	return s.closeErr
}

// track counts requests in flight so that Close waits for them.
func (s *Server) track(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.handlers.Add(1)
		defer s.handlers.Done()
		h.ServeHTTP(w, r)
	})
}

// noBody answers a request that comes with a body — which no path of the
// endpoint reads — on a connection that closes after the answer, without
// reading the body: net/http would otherwise read up to 256 KiB of it
// after the handler, with no deadline, and a client that announces a body
// and never sends it would hold one of the MaxConns connections for good
// (20 of them locked the endpoint out). The read deadline in the past ends
// that read at once.
func noBody(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ContentLength != 0 {
			w.Header().Set("Connection", "close")
			defer func() { _ = http.NewResponseController(w).SetReadDeadline(time.Unix(1, 0)) }()
		}
		h.ServeHTTP(w, r)
	})
}

// Handler returns the endpoint's HTTP handler, for serving it on a
// listener of one's own:
//
//	GET /              the list of paths
//	GET /v1/snapshot   everything (Snapshot, JSON)
//	GET /v1/devices    devices, ports, GIDs, limits, QPs, counters (JSON)
//	GET /v1/groups     multicast groups, memberships and joins (JSON)
//	GET /v1/ids        RDMA CM ids and event channels (JSON)
//	GET /v1/capture    a pcap stream; query: device, dir (both|sent|received),
//	                   count, duration (Go duration), snaplen
//	GET /metrics       Prometheus metrics (text exposition format)
//
// Other methods get 405, unknown paths 404, unknown or malformed query
// parameters 400, all with a JSON {"error": …} body.
func Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/", index)
	mux.HandleFunc("/v1/snapshot", jsonView(func(s *Snapshot) any { return s }))
	mux.HandleFunc("/v1/devices", jsonView(func(s *Snapshot) any {
		return struct {
			PID     int      `json:"pid"`
			Devices []Device `json:"devices"`
		}{s.PID, s.Devices}
	}))
	mux.HandleFunc("/v1/groups", jsonView(func(s *Snapshot) any {
		return struct {
			PID    int     `json:"pid"`
			Groups []Group `json:"groups"`
		}{s.PID, s.Groups}
	}))
	mux.HandleFunc("/v1/ids", jsonView(func(s *Snapshot) any {
		return struct {
			PID      int       `json:"pid"`
			IDs      []CMID    `json:"cm_ids"`
			Channels []Channel `json:"event_channels"`
			CM       CMStats   `json:"cm"`
		}{s.PID, s.IDs, s.Channels, s.CM}
	}))
	mux.HandleFunc("/v1/capture", captureHandler)
	metrics := promhttp.HandlerFor(Registry(), promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError})
	mux.HandleFunc("/metrics", func(w http.ResponseWriter, r *http.Request) {
		if !checkMethod(w, r) {
			return
		}
		metrics.ServeHTTP(w, r)
	})
	return recoverer(mux)
}

// recoverer turns a panic in a handler into a 500 (never a crash). It
// also answers the target "*", which ServeMux would refuse without a JSON
// body.
func recoverer(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			if v := recover(); v != nil {
				if v == http.ErrAbortHandler {
					panic(v)
				}
				httpError(w, http.StatusInternalServerError, fmt.Sprintf("internal error: %v", v))
			}
		}()
		if r.RequestURI == "*" {
			httpError(w, http.StatusNotFound, `no such path "*" (GET / lists them)`)
			return
		}
		h.ServeHTTP(w, r)
	})
}

type errorBody struct {
	Error string `json:"error"`
}

func httpError(w http.ResponseWriter, code int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(errorBody{msg})
}

func checkMethod(w http.ResponseWriter, r *http.Request) bool {
	if r.Method == http.MethodGet || r.Method == http.MethodHead {
		return true
	}
	w.Header().Set("Allow", "GET, HEAD")
	httpError(w, http.StatusMethodNotAllowed, "method "+r.Method+" not allowed")
	return false
}

// checkQuery refuses unknown or repeated query parameters.
func checkQuery(w http.ResponseWriter, r *http.Request, allowed ...string) bool {
	q, err := parseQuery(r.URL.RawQuery)
	if err != nil {
		httpError(w, http.StatusBadRequest, err.Error())
		return false
	}
	for k, vs := range q {
		ok := false
		for _, a := range allowed {
			ok = ok || a == k
		}
		if !ok {
			httpError(w, http.StatusBadRequest, fmt.Sprintf("unknown query parameter %q", k))
			return false
		}
		if len(vs) > 1 {
			httpError(w, http.StatusBadRequest, fmt.Sprintf("query parameter %q given %d times", k, len(vs)))
			return false
		}
	}
	return true
}

func parseQuery(raw string) (map[string][]string, error) {
	q, err := url.ParseQuery(raw)
	if err != nil {
		return nil, fmt.Errorf("malformed query: %v", err)
	}
	return q, nil
}

func index(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/" {
		httpError(w, http.StatusNotFound, "no such path "+strconv.Quote(r.URL.Path)+" (GET / lists them)")
		return
	}
	if !checkMethod(w, r) || !checkQuery(w, r) {
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	fmt.Fprintf(w, "softrdma introspection endpoint, process %d\n\n", os.Getpid())
	fmt.Fprint(w, `GET /v1/snapshot   everything (JSON)
GET /v1/devices    devices, ports, GIDs, limits, QPs, counters (JSON)
GET /v1/groups     multicast groups, memberships and joins (JSON)
GET /v1/ids        RDMA CM ids and event channels (JSON)
GET /v1/capture    pcap stream (?device=rxe_lo&dir=both|sent|received&count=N&duration=10s&snaplen=N)
GET /metrics       Prometheus metrics
`)
}

func jsonView(view func(*Snapshot) any) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if !checkMethod(w, r) || !checkQuery(w, r) {
			return
		}
		b, err := json.MarshalIndent(view(Collect()), "", "  ")
		if err != nil {
			httpError(w, http.StatusInternalServerError, err.Error())
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Write(append(b, '\n'))
	}
}

// CaptureRequest is what GET /v1/capture asks for; zero fields take the
// defaults (every device, both directions, no limit).
type CaptureRequest struct {
	Device    string
	Direction capture.Direction
	Count     int
	Duration  time.Duration
	Snaplen   int
}

// query encodes the request as /v1/capture query parameters.
func (c CaptureRequest) query() string {
	var q []string
	if c.Device != "" {
		q = append(q, "device="+url.QueryEscape(c.Device))
	}
	if c.Direction != capture.Both {
		q = append(q, "dir="+c.Direction.String())
	}
	if c.Count > 0 {
		q = append(q, "count="+strconv.Itoa(c.Count))
	}
	if c.Duration > 0 {
		q = append(q, "duration="+c.Duration.String())
	}
	if c.Snaplen > 0 {
		q = append(q, "snaplen="+strconv.Itoa(c.Snaplen))
	}
	return strings.Join(q, "&")
}

// maxCaptureSnaplen bounds snaplen.
const maxCaptureSnaplen = 262144

func parseCaptureRequest(q map[string][]string) (CaptureRequest, error) {
	var c CaptureRequest
	get := func(k string) string {
		if v := q[k]; len(v) > 0 {
			return v[0]
		}
		return ""
	}
	c.Device = get("device")
	d, err := capture.ParseDirection(get("dir"))
	if err != nil {
		return c, err
	}
	c.Direction = d
	if v := get("count"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return c, fmt.Errorf("count %q: want a number ≥ 0", v)
		}
		c.Count = n
	}
	if v := get("duration"); v != "" {
		dur, err := time.ParseDuration(v)
		if err != nil || dur < 0 {
			return c, fmt.Errorf("duration %q: want a Go duration ≥ 0 such as 10s", v)
		}
		c.Duration = dur
	}
	if v := get("snaplen"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 || n > maxCaptureSnaplen {
			return c, fmt.Errorf("snaplen %q: want 0..%d", v, maxCaptureSnaplen)
		}
		c.Snaplen = n
	}
	return c, nil
}

// captureHandler streams a pcap capture until count, duration, the client
// leaving or the endpoint closing.
func captureHandler(w http.ResponseWriter, r *http.Request) {
	if !checkMethod(w, r) || !checkQuery(w, r, "device", "dir", "count", "duration", "snaplen") {
		return
	}
	q, _ := parseQuery(r.URL.RawQuery)
	req, err := parseCaptureRequest(q)
	if err != nil {
		httpError(w, http.StatusBadRequest, err.Error())
		return
	}
	if req.Device != "" {
		found := false
		var names []string
		for _, d := range verbs.DefaultHost().Devices() {
			found = found || d.Name() == req.Device
			names = append(names, d.Name())
		}
		if !found {
			httpError(w, http.StatusNotFound, fmt.Sprintf("no device %q in process %d (devices: %s)", req.Device, os.Getpid(), strings.Join(names, ", ")))
			return
		}
	}
	if r.Method == http.MethodHead {
		w.Header().Set("Content-Type", "application/vnd.tcpdump.pcap")
		return
	}
	select {
	case captureSlots <- struct{}{}:
		defer func() { <-captureSlots }()
	default:
		w.Header().Set("Retry-After", "5")
		httpError(w, http.StatusServiceUnavailable, fmt.Sprintf("process %d already streams %d captures, the most it serves at once; end one and retry", os.Getpid(), MaxCaptures))
		return
	}
	rc := http.NewResponseController(w)
	// The server's WriteTimeout does not bound a stream; each write has
	// its own deadline instead (flushWriter).
	rc.SetWriteDeadline(time.Time{})
	w.Header().Set("Content-Type", "application/vnd.tcpdump.pcap")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(http.StatusOK)
	c, err := capture.Start(flushWriter{w, rc}, capture.Options{
		Device: req.Device, Direction: req.Direction, Snaplen: req.Snaplen, MaxPackets: req.Count,
	})
	if err != nil {
		return // the client went away before the header
	}
	var timeout <-chan time.Time
	if req.Duration > 0 {
		t := time.NewTimer(req.Duration)
		defer t.Stop()
		timeout = t.C
	}
	select {
	case <-c.Done():
	case <-r.Context().Done():
	case <-timeout:
	}
	c.Stop()
	// The end of the response gets a deadline of its own: the last
	// frame's may have passed while the capture idled.
	rc.SetWriteDeadline(time.Now().Add(captureWriteTimeout))
}

// flushWriter flushes the response after every write, so frames reach
// the client as they are captured. A write the client does not take
// within captureWriteTimeout fails, which ends the capture.
type flushWriter struct {
	w  io.Writer
	rc *http.ResponseController
}

// Write writes p to the response and flushes it.
func (f flushWriter) Write(p []byte) (int, error) {
	f.rc.SetWriteDeadline(time.Now().Add(captureWriteTimeout)) // unsupported by a ResponseRecorder: no deadline there
	n, err := f.w.Write(p)
	if err == nil {
		err = f.rc.Flush()
	}
	return n, err
}

// announce is where FromEnv prints a TCP endpoint's address and token.
var announce io.Writer = os.Stderr

// FromEnv turns on what the environment asks for: the endpoint when
// SOFTRDMA_DEBUG_ADDR is set (see Start; a TCP endpoint's address and
// token, unless the token came from SOFTRDMA_DEBUG_TOKEN, are printed on
// standard error), structured logs when
// SOFTRDMA_LOG is set (see LogFromEnv). With neither set it does nothing
// and nothing listens. The returned stop function undoes both; it is never
// nil. On an error the parts that worked stay on.
func FromEnv() (stop func(), err error) {
	var srv *Server
	var stopLog func()
	var errs []error
	if a := os.Getenv(EnvAddr); a != "" {
		if srv, err = Start(a); err != nil {
			errs = append(errs, fmt.Errorf("%s=%s: %w", EnvAddr, a, err))
		} else if srv.token != "" {
			if srv.tokenFromEnv {
				fmt.Fprintf(announce, "softrdma: introspection endpoint http://%s (token from %s)\n", srv.addr, EnvToken)
			} else {
				fmt.Fprintf(announce, "softrdma: introspection endpoint http://%s token %s (give it to the tools as %s=%s)\n", srv.addr, srv.token, EnvToken, srv.token)
			}
		}
	}
	if stopLog, err = LogFromEnv(); err != nil {
		errs = append(errs, err)
	}
	return func() {
		if srv != nil {
			srv.Close()
		}
		if stopLog != nil {
			stopLog()
		}
	}, errors.Join(errs...)
}
