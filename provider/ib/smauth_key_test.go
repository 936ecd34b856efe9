package ib_test

import (
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/softrdma/softrdma/ib/sm"
	"github.com/softrdma/softrdma/provider/ib"
)

// TestSMKey: a port with the subnet's key opens on an SM with that key
// and is refused (EACCES) by an SM with another; a key file others may
// read is refused before anything is sent.
func TestSMKey(t *testing.T) {
	key := []byte("the subnet's key, 32 bytes long!")
	s, _ := stoppableSM(t, sm.Config{Key: key})
	d, err := ib.Open(ib.Config{SM: s.FabricAddr().String(), Local: netip.MustParseAddr("127.0.7.5"), SMKey: key})
	if err != nil {
		t.Fatalf("open with the SM's key: %v", err)
	}
	d.Close()

	other, _ := stoppableSM(t, sm.Config{Key: []byte("another key of the same length!!")})
	if d, err := ib.Open(ib.Config{SM: other.FabricAddr().String(), Local: netip.MustParseAddr("127.0.7.6"), SMKey: key}); err == nil {
		d.Close()
		t.Error("a port opened on an SM with another key")
	} else if !errors.Is(err, syscall.EACCES) || !strings.Contains(err.Error(), "wrong MAC") {
		t.Errorf("open on an SM with another key: %v; want EACCES, wrong MAC", err)
	}

	file := filepath.Join(t.TempDir(), "sm.key")
	if err := os.WriteFile(file, key, 0o644); err != nil {
		t.Fatal(err)
	}
	if d, err := ib.Open(ib.Config{SM: s.FabricAddr().String(), Local: netip.MustParseAddr("127.0.7.7"), SMKeyFile: file}); err == nil {
		d.Close()
		t.Error("a port opened with a key file others may read")
	} else if !errors.Is(err, syscall.EACCES) || !strings.Contains(err.Error(), "mode 0644") {
		t.Errorf("open with a key file of mode 0644: %v", err)
	}
	os.Chmod(file, 0o600)
	d, err = ib.Open(ib.Config{SM: s.FabricAddr().String(), Local: netip.MustParseAddr("127.0.7.7"), SMKeyFile: file})
	if err != nil {
		t.Fatalf("open with the key file: %v", err)
	}
	d.Close()
}
