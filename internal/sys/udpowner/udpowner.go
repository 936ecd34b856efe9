// Package udpowner tells who holds a local UDP address: the owner uid of
// every socket bound to it, as the kernel lists them in /proc/net/udp and
// /proc/net/udp6 (of the network namespace of the calling process), and
// where /proc lets it, the process that has the socket open.
//
// The kernel records a socket's owner when the socket is created and
// nobody can change it afterwards, so the uid is proof of who may read
// what arrives at the address: it is how an InfiniBand port of softrdma
// authenticates a subnet manager on its own host (provider/ib), and how
// softsm says who holds its address when it cannot bind it.
package udpowner

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// Socket is one UDP socket of the host's table.
type Socket struct {
	// Local is the address the socket is bound to (an unspecified
	// address for a wildcard bind); IPv4 addresses of udp6 sockets are
	// unmapped.
	Local netip.AddrPort
	// V6 is set for a socket of /proc/net/udp6 (an IPv6 socket).
	V6 bool
	// UID is the socket's owner.
	UID int
	// Inode is the socket's inode number (socket:[inode] in /proc/PID/fd).
	Inode uint64
}

// Tables are the kernel's UDP socket tables, IPv4 then IPv6 (a variable
// for tests).
var Tables = []string{"/proc/net/udp", "/proc/net/udp6"}

// Holders returns the sockets that may receive the datagrams sent to a:
// those bound to a's port on a itself or on a wildcard address (of either
// family: a dual-stack IPv6 wildcard socket takes IPv4 too); for a
// wildcard a, every socket on its port (each keeps a from being bound).
// It fails only when no table can be read (no /proc).
func Holders(a netip.AddrPort) ([]Socket, error) {
	want := a.Addr().Unmap()
	var out []Socket
	var firstErr error
	read := 0
	for i, f := range Tables {
		b, err := os.ReadFile(f)
		if err != nil {
			if firstErr == nil {
				firstErr = err
			}
			continue
		}
		read++
		for _, s := range parse(b) {
			s.V6 = i%2 == 1
			if s.Local.Port() != a.Port() || (want.Is6() && !s.V6) {
				continue // an IPv4 socket receives no IPv6 datagram
			}
			if s.Local.Addr() == want || s.Local.Addr().IsUnspecified() || want.IsUnspecified() {
				out = append(out, s)
			}
		}
	}
	if read == 0 {
		return nil, fmt.Errorf("udpowner: %w", firstErr)
	}
	return out, nil
}

// parse reads a /proc/net/udp or udp6 table.
func parse(b []byte) []Socket {
	var out []Socket
	lines := bytes.Split(b, []byte("\n"))
	if len(lines) > 0 {
		lines = lines[1:] // the header
	}
	for _, l := range lines {
		fs := strings.Fields(string(l))
		if len(fs) < 10 {
			continue
		}
		local, ok := parseAddr(fs[1])
		if !ok {
			continue
		}
		uid, err1 := strconv.Atoi(fs[7])
		inode, err2 := strconv.ParseUint(fs[9], 10, 64)
		if err1 != nil || err2 != nil {
			continue
		}
		out = append(out, Socket{Local: local, UID: uid, Inode: inode})
	}
	return out
}

// parseAddr reads "0100007F:12B8" (udp) or the 32-digit udp6 form: the
// address as 32-bit words in host byte order, the port in hex.
func parseAddr(s string) (netip.AddrPort, bool) {
	h, p, ok := strings.Cut(s, ":")
	port, err := strconv.ParseUint(p, 16, 16)
	if !ok || err != nil {
		return netip.AddrPort{}, false
	}
	raw, err := hex.DecodeString(h)
	if err != nil || (len(raw) != 4 && len(raw) != 16) {
		return netip.AddrPort{}, false
	}
	ip := make([]byte, len(raw))
	for i := 0; i < len(raw); i += 4 {
		binary.BigEndian.PutUint32(ip[i:], binary.NativeEndian.Uint32(raw[i:]))
	}
	a, _ := netip.AddrFromSlice(ip)
	return netip.AddrPortFrom(a.Unmap(), uint16(port)), true
}

// Process is a process that has a socket open.
type Process struct {
	PID  int
	Comm string // its command name (/proc/PID/comm)
}

// ProcDir is the proc file system (a variable for tests).
var ProcDir = "/proc"

// Processes returns the processes that have the socket of inode open,
// among those whose descriptors the caller may read (all of them for
// root), in PID order.
func Processes(inode uint64) []Process {
	ents, err := os.ReadDir(ProcDir)
	if err != nil {
		return nil
	}
	link := fmt.Sprintf("socket:[%d]", inode)
	var out []Process
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid <= 0 {
			continue
		}
		fdDir := filepath.Join(ProcDir, e.Name(), "fd")
		fds, err := os.ReadDir(fdDir)
		if err != nil {
			continue
		}
		for _, fd := range fds {
			if l, err := os.Readlink(filepath.Join(fdDir, fd.Name())); err == nil && l == link {
				comm, _ := os.ReadFile(filepath.Join(ProcDir, e.Name(), "comm"))
				out = append(out, Process{PID: pid, Comm: strings.TrimSpace(string(comm))})
				break
			}
		}
	}
	slices.SortFunc(out, func(a, b Process) int { return a.PID - b.PID })
	return out
}

// Describe says who holds a in words: "uid 1001 (pid 4242 fakesm)",
// several holders joined by ", ", or "" when no socket holds a.
func Describe(a netip.AddrPort) string {
	hs, err := Holders(a)
	if err != nil || len(hs) == 0 {
		return ""
	}
	var parts []string
	for _, h := range hs {
		s := fmt.Sprintf("uid %d", h.UID)
		var ps []string
		for _, p := range Processes(h.Inode) {
			ps = append(ps, fmt.Sprintf("pid %d %s", p.PID, p.Comm))
		}
		if len(ps) > 0 {
			s += " (" + strings.Join(ps, ", ") + ")"
		}
		if h.Local.Addr() != a.Addr().Unmap() {
			s += " on " + h.Local.String()
		}
		if !slices.Contains(parts, s) {
			parts = append(parts, s)
		}
	}
	return strings.Join(parts, ", ")
}
