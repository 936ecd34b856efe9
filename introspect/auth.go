package introspect

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
)

// The endpoint's trust model, enforced here for every request a Server
// serves (Handler alone enforces nothing):
//   - Unix socket: the file is 0600 (listenUnix), and the process at the
//     other end (SO_PEERCRED) must have this process's effective uid or
//     be root — also when the caller's own listener was looser.
//   - TCP (loopback only): the Host header must name this endpoint
//     (127.0.0.1:PORT, [::1]:PORT or localhost:PORT as it listens), which
//     a page loaded through DNS rebinding cannot send, and the request
//     must carry the token ("Authorization: Bearer TOKEN"), which only who
//     started the process (its environment or its standard error) knows.

// EnvToken is the environment variable holding the token of a TCP
// endpoint: the process takes it from there (else it makes one up and
// prints it), and Dial sends it.
const EnvToken = "SOFTRDMA_DEBUG_TOKEN"

// minTokenLen is the shortest token accepted from the environment.
const minTokenLen = 16

// tokenFromEnv returns the token SOFTRDMA_DEBUG_TOKEN holds, or a fresh
// random one (fromEnv false) when it is unset.
func tokenFromEnv() (tok string, fromEnv bool, err error) {
	if tok = os.Getenv(EnvToken); tok != "" {
		if err := checkToken(tok); err != nil {
			return "", false, fmt.Errorf("introspect: %s: %w", EnvToken, err)
		}
		return tok, true, nil
	}
	var b [16]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:]), false, nil
}

// checkToken refuses tokens that are short or cannot travel in a header.
func checkToken(tok string) error {
	if len(tok) < minTokenLen || len(tok) > 256 {
		return fmt.Errorf("token must be %d to 256 characters, not %d", minTokenLen, len(tok))
	}
	for _, c := range []byte(tok) {
		if c <= ' ' || c >= 0x7f {
			return fmt.Errorf("token must be printable ASCII without spaces")
		}
	}
	return nil
}

// peerKey is the context key of a Unix connection's peer credentials.
type peerKey struct{}

// peerInfo is what ConnContext learned about a Unix connection's peer.
type peerInfo struct {
	uid, pid int
	err      error
}

// connContext records the peer credentials of Unix connections.
func connContext(ctx context.Context, c net.Conn) context.Context {
	if _, ok := c.(*net.UnixConn); !ok {
		return ctx
	}
	cred, err := peerCred(c)
	p := peerInfo{err: err}
	if err == nil {
		p.uid, p.pid = int(cred.Uid), int(cred.Pid)
	}
	return context.WithValue(ctx, peerKey{}, p)
}

// guard enforces the trust model in front of h.
func (s *Server) guard(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if code, msg := s.refusal(r); code != 0 {
			if code == http.StatusUnauthorized {
				w.Header().Set("WWW-Authenticate", `Bearer realm="softrdma"`)
			}
			httpError(w, code, msg)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// refusal returns the status and message the trust model refuses r with,
// or 0 if it lets r through. On a Unix socket it reads the peer from r's
// context (connContext, or the gate for a screened connection).
func (s *Server) refusal(r *http.Request) (int, string) {
	if s.network == "unix" {
		euid := os.Geteuid()
		p, ok := r.Context().Value(peerKey{}).(peerInfo)
		switch {
		case !ok:
			return http.StatusForbidden, "cannot tell who is connecting: the listener does not give Unix socket connections"
		case p.err != nil:
			return http.StatusForbidden, "cannot tell who is connecting: " + p.err.Error()
		case p.uid != euid && p.uid != 0:
			return http.StatusForbidden, fmt.Sprintf("uid %d (pid %d) may not read the endpoint of process %d (uid %d)", p.uid, p.pid, os.Getpid(), euid)
		}
		return 0, ""
	}
	if !s.hostAllowed(r.Host) {
		return http.StatusForbidden, fmt.Sprintf("Host %q is not this endpoint (%s); refused (DNS rebinding?)", r.Host, s.addr)
	}
	tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok || subtle.ConstantTimeCompare([]byte(tok), []byte(s.token)) != 1 {
		if ok {
			return http.StatusUnauthorized, "wrong token (" + EnvToken + ")"
		}
		return http.StatusUnauthorized, "token required: set " + EnvToken + " to the token the process printed or was started with"
	}
	return 0, ""
}

// hostAllowed reports whether a request's Host names this TCP endpoint
// (see hostMatches).
func (s *Server) hostAllowed(host string) bool {
	return hostMatches(host, s.addr)
}

// hostMatches reports whether the Host header host names the loopback
// listener at addr ("IP:PORT"): "IP:PORT" or "localhost:PORT" (an IPv6 IP
// in brackets), or, for port 80, also without the port; letter case
// aside, nothing else.
func hostMatches(host, addr string) bool {
	ip, port, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	names := []string{net.JoinHostPort(ip, port), net.JoinHostPort("localhost", port)}
	if port == "80" {
		names = append(names, strings.TrimSuffix(net.JoinHostPort(ip, port), ":80"), "localhost")
	}
	for _, n := range names {
		if strings.EqualFold(host, n) {
			return true
		}
	}
	return false
}
