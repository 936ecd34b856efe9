package fabric

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// TestReadKeyFile: a key file is taken only when neither group nor others
// may access it, it is owned by the reader or root, and it holds a key of
// MinKeyLen bytes or more (a trailing newline is not part of it).
func TestReadKeyFile(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), mode); err != nil {
			t.Fatal(err)
		}
		os.Chmod(p, mode)
		return p
	}
	const key = "0123456789abcdef0123"
	k, err := ReadKeyFile(write("ok", key+"\n", 0o600))
	if err != nil || string(k) != key {
		t.Fatalf("mode 600: %q %v", k, err)
	}
	for _, m := range []os.FileMode{0o640, 0o604, 0o660, 0o602} {
		if _, err := ReadKeyFile(write("m", key, m)); !errors.Is(err, syscall.EACCES) {
			t.Errorf("mode %#o: %v, want EACCES", m, err)
		}
	}
	if _, err := ReadKeyFile(write("short", "short\n", 0o600)); !errors.Is(err, syscall.EINVAL) {
		t.Errorf("short key: %v", err)
	}
	if _, err := ReadKeyFile(dir); err == nil {
		t.Error("a directory taken as a key file")
	}
	if os.Geteuid() == 0 {
		p := write("other", key, 0o600)
		if err := os.Chown(p, 65534, 65534); err != nil {
			t.Fatal(err)
		}
		if _, err := ReadKeyFile(p); !errors.Is(err, syscall.EACCES) {
			t.Errorf("owned by uid 65534: %v, want EACCES", err)
		}
	}
}

// TestControlMAC: the MAC covers the message and the nonce: another
// nonce, another key or any changed field fails the check.
func TestControlMAC(t *testing.T) {
	key, nonce := []byte("0123456789abcdef"), []byte("nonce-0123456789")
	c := &Control{Type: TypePortInfo, GUID: 7, LID: 2, SMLID: 1, Epoch: 9, Session: []byte("s")}
	c.MAC = ControlMAC(key, nonce, c)
	if !CheckControlMAC(key, nonce, c) {
		t.Fatal("own MAC refused")
	}
	d, err := DecodeControl(EncodeControl(c))
	if err != nil || !CheckControlMAC(key, nonce, d) {
		t.Fatalf("MAC after a round trip refused: %v", err)
	}
	if CheckControlMAC(key, []byte("nonce-0123456780"), c) || CheckControlMAC([]byte("0123456789abcdeF"), nonce, c) {
		t.Error("MAC taken with another nonce or key")
	}
	c.LID = 3
	if CheckControlMAC(key, nonce, c) {
		t.Error("MAC taken for a changed LID")
	}
	if KeyFingerprint(key) == KeyFingerprint([]byte("0123456789abcdeF")) || len(KeyFingerprint(key)) != 16 {
		t.Errorf("fingerprint %q", KeyFingerprint(key))
	}
}
