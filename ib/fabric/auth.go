package fabric

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"syscall"
)

// Authenticating the SM. A port sends everything it has (SA MADs,
// multicast payloads) to the SM's fabric address, so whoever holds that
// address when the SM is down (stopped, restarting, killed) would get it
// all and could answer as the SM. A port therefore trusts an SM it can
// authenticate, not an address:
//
//   - With a key (EnvKeyFile for ports, softsm -key-file; the operator
//     gives both the same file, as IB's SM_Key is configured on every SM),
//     every attach carries a fresh Nonce and the SM's port_info and
//     refused carry MAC, ControlMAC over that nonce and the whole message:
//     nothing an impostor without the key sends is taken, and no answer
//     can be replayed to another attach.
//   - Without a key, a port on the SM's host asks the kernel who owns the
//     socket bound to the SM's address (package internal/sys/udpowner):
//     it trusts root, its own uid and the uids the user names
//     (EnvTrustUID). The SM's Session token, which one SM instance gives
//     each port and nobody else sees, tells the port that later answers
//     come from the SM it checked; an answer without it, or with another,
//     is from another SM (or an impostor) and is checked again.
//
// A port remembers its SM's identity (key fingerprint or owner uid, and
// SMGUID) and says so loudly when it changes.

// Authentication constants.
const (
	// NonceLen is the length of an attach's Nonce.
	NonceLen = 16
	// SessionLen is the length of a port_info's Session token.
	SessionLen = 12
	// MACLen is the length of a MAC (HMAC-SHA256, cut).
	MACLen = 16
	// MinKeyLen is the shortest key a key file may hold.
	MinKeyLen = 16
	// maxKeyFile is the largest key file read.
	maxKeyFile = 4096
)

// Environment variables of the ports (and of softsm for the key file).
const (
	// EnvKeyFile names the key file: the key the SM must prove it holds.
	EnvKeyFile = "SOFTRDMA_SM_KEY_FILE"
	// EnvTrustUID names uids (comma-separated) that a port trusts as the
	// owner of its SM's socket besides root and its own.
	EnvTrustUID = "SOFTRDMA_SM_UID"
)

// ReadKeyFile reads a key file: a regular file of MinKeyLen to 4096
// bytes (trailing newlines are not part of the key), owned by the reader
// (effective uid) or root, that neither group nor others may read or
// write. Anything else is refused with an error that says why (EACCES
// for the file's owner or mode): a key others can read proves nothing.
func ReadKeyFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("key file: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("key file: %w", err)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	switch {
	case !fi.Mode().IsRegular():
		return nil, fmt.Errorf("key file %s: not a regular file: %w", path, syscall.EINVAL)
	case fi.Mode().Perm()&0o077 != 0:
		return nil, fmt.Errorf("key file %s: group or others may access it (mode %#o): refusing it (chmod 600): %w",
			path, fi.Mode().Perm(), syscall.EACCES)
	case !ok:
		return nil, fmt.Errorf("key file %s: no owner: %w", path, syscall.EINVAL)
	case st.Uid != 0 && int(st.Uid) != os.Geteuid():
		return nil, fmt.Errorf("key file %s: owned by uid %d, neither this user (uid %d) nor root: refusing it: %w",
			path, st.Uid, os.Geteuid(), syscall.EACCES)
	}
	b, err := io.ReadAll(io.LimitReader(f, maxKeyFile+1))
	if err != nil {
		return nil, fmt.Errorf("key file %s: %w", path, err)
	}
	for len(b) > 0 && (b[len(b)-1] == '\n' || b[len(b)-1] == '\r') {
		b = b[:len(b)-1]
	}
	if len(b) < MinKeyLen || len(b) > maxKeyFile {
		return nil, fmt.Errorf("key file %s: %d bytes, want %d to %d: %w", path, len(b), MinKeyLen, maxKeyFile, syscall.EINVAL)
	}
	return b, nil
}

// KeyFingerprint names a key without revealing it: 8 bytes of a SHA-256
// of it, in hex.
func KeyFingerprint(key []byte) string {
	h := sha256.New()
	h.Write([]byte("softrdma sm key fingerprint\x00"))
	h.Write(key)
	return hex.EncodeToString(h.Sum(nil)[:8])
}

// ControlMAC is the MAC of a message of the SM that answers an attach
// with nonce: HMAC-SHA256 under key of a domain string, the nonce and the
// JSON of c without its MAC, cut to MACLen. The port's GUID, the LIDs and
// everything else the message says are in the JSON; the nonce binds it to
// one attach.
func ControlMAC(key, nonce []byte, c *Control) []byte {
	cc := *c
	cc.MAC = nil
	j, err := json.Marshal(&cc)
	if err != nil { // cannot happen: every field has a JSON form
		panic(err)
	}
	m := hmac.New(sha256.New, key)
	m.Write([]byte("softrdma sm control mac v1\x00"))
	m.Write([]byte{byte(len(nonce))})
	m.Write(nonce)
	m.Write(j)
	return m.Sum(nil)[:MACLen]
}

// CheckControlMAC reports whether c carries the MAC of key over nonce.
func CheckControlMAC(key, nonce []byte, c *Control) bool {
	return len(c.MAC) == MACLen && len(nonce) > 0 && hmac.Equal(c.MAC, ControlMAC(key, nonce, c))
}
