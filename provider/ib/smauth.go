package ib

import (
	"bytes"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/softrdma/softrdma/ib/fabric"
	"github.com/softrdma/softrdma/internal/sys/udpowner"
	"github.com/softrdma/softrdma/logging"
)

// A port trusts an SM it can authenticate, not an address. Everything
// the port sends (its SA MADs, its multicast payloads) goes to the SM's
// fabric address, and whatever comes from there is taken as the SM's and
// the switch's; while the SM is down (stopped, restarting, killed) anyone
// on the host may bind that address. So (see ib/fabric's auth.go):
//
//   - With a key (Config.SMKey, SMKeyFile, or SOFTRDMA_SM_KEY_FILE for
//     OpenFromEnv): every attach carries a fresh nonce, and a port_info
//     or refused is taken only with the MAC of the key over the nonce of
//     one of the port's last attaches (each nonce taken once: no replay).
//     The key is the SM's identity, as IB's SM_Key is.
//   - Without a key, on the SM's host: the kernel says who owns the
//     socket bound to the SM's address (/proc/net/udp and udp6, package
//     internal/sys/udpowner); the port trusts root, its own effective uid
//     and Config.TrustSMUIDs (SOFTRDMA_SM_UID), and remembers the SM's
//     Session token. A port_info with that token comes from the SM the
//     port checked (only that SM instance knows the token, and only the
//     port ever received it); any other is checked again. Open checks
//     before its first attach: a port whose SM address another uid holds
//     sends it nothing and fails at once (EACCES, naming the uid).
//   - Without a key and an SM on another host, nothing can be checked:
//     the port trusts the address, as before, and warns once.
//
// A port_info or refused the port cannot authenticate is dropped and
// counted (UntrustedDrops) and logged (once per reason): Open fails at
// once with it (EACCES), an active port goes down (PortError) and sends
// nothing more until its SM is authenticated again; IB packets and flow
// control from the address are dropped (UntrustedDrops) while the SM is
// not authenticated. The port also checks the owner when an active SM
// falls silent for two keepalives (an impostor that only listens). The
// port remembers its SM's identity (key fingerprint or owner uid, and
// SM GUID) and logs a warning when an authenticated SM has another.

// Authentication limits.
const (
	// nonceRing is how many of its last attaches' nonces a port takes a
	// MAC over (answers may come to an earlier attach).
	nonceRing = 4
	// recheckAfter is how long a port waits before asking the kernel
	// again after it found its SM's address held by someone it does not
	// trust: an impostor's flood of port_infos costs at most one look at
	// /proc a second.
	recheckAfter = time.Second
	// silentChecks is how many keepalive intervals an active SM may be
	// silent before the port looks who holds its address.
	silentChecks = 2
)

// smAuth is a port's knowledge of its SM (guarded by Device.mu).
type smAuth struct {
	key     []byte            // the subnet's key; nil: authenticate by owner
	uids    []int             // the uids trusted as owners
	local   bool              // the SM's address is one of this host's
	nonces  [nonceRing][]byte // the last attaches' nonces (key)
	next    int               // the ring's next slot
	session []byte            // the Session token of the SM checked (no key)
	checked bool              // the SM's owner was checked (session is its)
	id      string            // identity of the SM last authenticated
	badAt   time.Time         // when an owner check last failed
	bad     error             // that failure
	logged  string            // the last refusal logged
	warned  bool              // the unauthenticated remote SM was warned of
}

// errUntrusted marks the errors of an SM the port does not trust.
var errUntrusted = syscall.EACCES

// setupAuth reads the key and finds whether the SM's address is local.
func (d *Device) setupAuth() error {
	a := &d.auth
	a.key = d.cfg.SMKey
	if len(a.key) == 0 && d.cfg.SMKeyFile != "" {
		k, err := fabric.ReadKeyFile(d.cfg.SMKeyFile)
		if err != nil {
			return err
		}
		a.key = k
	}
	if len(a.key) > 0 && len(a.key) < fabric.MinKeyLen {
		return fmt.Errorf("SM key of %d bytes: want at least %d: %w", len(a.key), fabric.MinKeyLen, syscall.EINVAL)
	}
	a.uids = append([]int{0, os.Geteuid()}, d.cfg.TrustSMUIDs...)
	a.local = localAddr(d.smAddr.Addr())
	return nil
}

// localAddr reports whether a is an address of this host (loopback or an
// interface's): a socket bound there is in this host's tables.
func localAddr(a netip.Addr) bool {
	if a.IsLoopback() || a.IsUnspecified() {
		return true
	}
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return false
	}
	for _, ia := range addrs {
		if n, ok := ia.(*net.IPNet); ok {
			if b, ok := netip.AddrFromSlice(n.IP); ok && b.Unmap() == a {
				return true
			}
		}
	}
	return false
}

// ParseUIDs parses SOFTRDMA_SM_UID: uids, comma-separated.
func ParseUIDs(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		n, err := strconv.ParseUint(f, 10, 31)
		if err != nil {
			return nil, fmt.Errorf("%s=%q: bad uid %q: %w", fabric.EnvTrustUID, s, f, syscall.EINVAL)
		}
		out = append(out, int(n))
	}
	return out, nil
}

// newNonce returns the nonce of the next attach and keeps it in the ring.
// d.mu is held.
func (d *Device) newNonceLocked() []byte {
	n := make([]byte, fabric.NonceLen)
	rand.Read(n)
	d.auth.nonces[d.auth.next] = n
	d.auth.next = (d.auth.next + 1) % nonceRing
	return n
}

// checkMAC reports whether c carries the key's MAC over one of the last
// nonces, and takes that nonce (no answer is taken twice). d.mu is held.
func (d *Device) checkMACLocked(c *fabric.Control) bool {
	for i, n := range d.auth.nonces {
		if n != nil && fabric.CheckControlMAC(d.auth.key, n, c) {
			d.auth.nonces[i] = nil
			return true
		}
	}
	return false
}

// heldError is an SM address held by a socket of a uid the port does not
// trust (errors.Is finds errUntrusted).
type heldError struct{ msg string }

func (e *heldError) Error() string { return e.msg }
func (e *heldError) Unwrap() error { return errUntrusted }

// ownerCheck asks the kernel who holds the SM's address: nil when every
// socket there is a trusted uid's, with the identity; a *heldError naming
// the uids when one is not, an errUntrusted error when the owner cannot
// be told. remote is set when the address is not this host's (nothing to
// check). Called without d.mu.
func (d *Device) ownerCheck() (id string, remote bool, err error) {
	hs, err := udpowner.Holders(d.smAddr)
	if err != nil || len(hs) == 0 {
		switch {
		case !d.auth.local:
			return "", true, nil
		case err != nil:
			return "", false, fmt.Errorf("cannot tell who holds the subnet manager's address %v (%v): %w", d.smAddr, err, errUntrusted)
		}
		return "", false, fmt.Errorf("no socket holds the subnet manager's address %v: %w", d.smAddr, errUntrusted)
	}
	var uids, bad []int
	var who []string
	for _, h := range hs {
		if slices.Contains(uids, h.UID) {
			continue
		}
		uids = append(uids, h.UID)
		if !slices.Contains(d.auth.uids, h.UID) {
			bad = append(bad, h.UID)
			w := fmt.Sprintf("uid %d", h.UID)
			var ps []string
			for _, p := range udpowner.Processes(h.Inode) {
				ps = append(ps, fmt.Sprintf("pid %d %s", p.PID, p.Comm))
			}
			if len(ps) > 0 {
				w += " (" + strings.Join(ps, ", ") + ")"
			}
			who = append(who, w)
		}
	}
	if len(bad) > 0 {
		return "", false, &heldError{fmt.Sprintf("the subnet manager's address %v is held by %s, neither root nor this user (uid %d): refusing it (%s=%d would trust it)",
			d.smAddr, strings.Join(who, ", "), os.Geteuid(), fabric.EnvTrustUID, bad[0])}
	}
	s := make([]string, len(uids))
	for i, u := range uids {
		s[i] = strconv.Itoa(u)
	}
	return "uid " + strings.Join(s, ","), false, nil
}

// preCheck is Open's check before its first attach: without a key, a
// local SM address held by an untrusted uid fails Open at once (the port
// sends it nothing). An address nobody holds yet is left to the attach.
func (d *Device) preCheck() error {
	if len(d.auth.key) > 0 || !d.auth.local {
		return nil
	}
	_, _, err := d.ownerCheck()
	var held *heldError
	if errors.As(err, &held) {
		return err
	}
	return nil
}

// authenticate checks that a port_info or refused comes from a trusted
// SM (see the file comment) and notes the SM's identity; the error says
// why not. Receive goroutine.
func (d *Device) authenticate(c *fabric.Control) error {
	d.mu.Lock()
	a := &d.auth
	if len(a.key) > 0 {
		ok := d.checkMACLocked(c)
		d.mu.Unlock()
		if !ok {
			what := "no MAC"
			if len(c.MAC) > 0 {
				what = "a wrong MAC"
			}
			return fmt.Errorf("the subnet manager at %v did not prove it holds the key (fingerprint %s): %s with its %s: %w",
				d.smAddr, fabric.KeyFingerprint(a.key), what, c.Type, errUntrusted)
		}
		d.identified("key "+fabric.KeyFingerprint(a.key), c.SMGUID)
		return nil
	}
	if c.Type == fabric.TypePortInfo && a.checked && len(a.session) > 0 && bytes.Equal(c.Session, a.session) {
		d.mu.Unlock()
		return nil // the SM checked
	}
	if a.bad != nil && time.Since(a.badAt) < recheckAfter {
		err := a.bad
		d.mu.Unlock()
		return err
	}
	d.mu.Unlock()
	id, remote, err := d.ownerCheck()
	d.mu.Lock()
	if err != nil {
		a.bad, a.badAt = err, time.Now()
		a.checked, a.session = false, nil
		d.mu.Unlock()
		return err
	}
	a.bad = nil
	if c.Type == fabric.TypePortInfo {
		a.checked, a.session = true, c.Session
	}
	warn := remote && !a.warned
	a.warned = a.warned || remote
	d.mu.Unlock()
	if warn {
		d.logf(false, "the subnet manager at %v is on another host and the port has no key (%s): it is trusted by its address only",
			d.smAddr, fabric.EnvKeyFile)
	}
	if remote {
		id = "address " + d.smAddr.String()
	}
	d.identified(id, c.SMGUID)
	return nil
}

// identified notes the identity of an authenticated SM and warns when it
// is not the one the port knew.
func (d *Device) identified(id string, smGUID uint64) {
	if smGUID != 0 {
		id += fmt.Sprintf(", SM GUID %#x", smGUID)
	}
	d.mu.Lock()
	old := d.auth.id
	d.auth.id = id
	d.auth.logged = ""
	d.mu.Unlock()
	if old != "" && old != id {
		d.logf(false, "the subnet manager at %v changed identity: was %s, now %s", d.smAddr, old, id)
	}
}

// untrusted handles a message of an SM the port does not trust: dropped
// and counted by the caller; Open fails with err, an active port goes
// down and sends nothing more until its SM is authenticated again (and
// logs err, once per reason). Receive goroutine (or keepalive).
func (d *Device) untrusted(err error) {
	d.smTrusted.Store(false)
	d.mu.Lock()
	opening := d.epoch == 0
	if opening && d.refusal == nil {
		d.refusal = err // Open returns it
		close(d.refusedCh)
	}
	wasActive := d.active
	d.active = false
	log := !opening && d.auth.logged != err.Error()
	d.auth.logged = err.Error()
	d.mu.Unlock()
	if log {
		d.logf(true, "%v", err)
	}
	if wasActive {
		select {
		case d.events <- PortEvent{Kind: PortError}:
		case <-d.done:
		}
	}
}

// silentCheck looks who holds the address of an active SM that has been
// silent for silentChecks keepalives (no key, local SM): an untrusted
// holder takes the port down at once. Keepalive goroutine.
func (d *Device) silentCheck() {
	d.mu.Lock()
	check := d.active && len(d.auth.key) == 0 && d.auth.local &&
		time.Since(d.lastSeen) > silentChecks*fabric.KeepaliveInterval
	d.mu.Unlock()
	if !check {
		return
	}
	var held *heldError
	if _, _, err := d.ownerCheck(); errors.As(err, &held) {
		d.mu.Lock()
		d.auth.checked, d.auth.session = false, nil
		d.auth.bad, d.auth.badAt = err, time.Now()
		d.mu.Unlock()
		d.untrusted(err)
	}
}

// logf reports an event of the port's trust in its SM: to the logger of
// package logging when it is on (Error when bad, else Warn), else to
// stderr: a port refusing its SM or seeing it change says so loudly.
func (d *Device) logf(bad bool, format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	if l := logging.Logger(); l != nil {
		if bad {
			l.Error(msg, "device", d.name, "sm", d.smAddr.String())
		} else {
			l.Warn(msg, "device", d.name, "sm", d.smAddr.String())
		}
		return
	}
	fmt.Fprintf(os.Stderr, "softrdma: %s: %s\n", d.name, msg)
}
