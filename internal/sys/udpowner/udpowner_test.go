package udpowner

import (
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestHoldersTables: the tables' addresses (host-order words), uids and
// inodes are read; a socket on the address itself or on a wildcard of a
// family that receives it is a holder, others are not.
func TestHoldersTables(t *testing.T) {
	dir := t.TempDir()
	v4 := `  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode ref pointer drops
  1: 0100007F:12B8 00000000:0000 07 00000000:00000000 00:00000000 00000000  1001        0 4242 2 0000000000000000 0
  2: 00000000:12B8 00000000:0000 07 00000000:00000000 00:00000000 00000000  1002        0 4243 2 0000000000000000 0
  3: 0200007F:12B8 00000000:0000 07 00000000:00000000 00:00000000 00000000  1003        0 4244 2 0000000000000000 0
  4: 0100007F:12B9 00000000:0000 07 00000000:00000000 00:00000000 00000000  1004        0 4245 2 0000000000000000 0
`
	v6 := `  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode ref pointer drops
  5: 00000000000000000000000001000000:12B8 00000000000000000000000000000000:0000 07 00000000:00000000 00:00000000 00000000  1005        0 4246 2 0000000000000000 0
  6: 00000000000000000000000000000000:12B8 00000000000000000000000000000000:0000 07 00000000:00000000 00:00000000 00000000  1006        0 4247 2 0000000000000000 0
`
	f4, f6 := filepath.Join(dir, "udp"), filepath.Join(dir, "udp6")
	os.WriteFile(f4, []byte(v4), 0o600)
	os.WriteFile(f6, []byte(v6), 0o600)
	old := Tables
	Tables = []string{f4, f6}
	defer func() { Tables = old }()
	uids := func(a string) []int {
		hs, err := Holders(netip.MustParseAddrPort(a))
		if err != nil {
			t.Fatal(err)
		}
		var u []int
		for _, h := range hs {
			u = append(u, h.UID)
		}
		return u
	}
	for _, c := range []struct {
		addr string
		want []int
	}{
		{"127.0.0.1:4792", []int{1001, 1002, 1006}},
		{"127.0.0.2:4792", []int{1002, 1003, 1006}},
		{"[::1]:4792", []int{1005, 1006}},
		{"127.0.0.1:4793", []int{1004}},
		{"0.0.0.0:4792", []int{1001, 1002, 1003, 1005, 1006}},
		{"127.0.0.1:9", nil},
	} {
		if got := uids(c.addr); !equal(got, c.want) {
			t.Errorf("holders of %s: uids %v, want %v", c.addr, got, c.want)
		}
	}
	if hs, _ := Holders(netip.MustParseAddrPort("127.0.0.1:4793")); len(hs) != 1 || hs[0].Inode != 4245 || hs[0].V6 {
		t.Errorf("holders of 127.0.0.1:4793: %+v", hs)
	}
}

func equal(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestDescribeOwnSocket: a socket of this process is found in the real
// tables with this uid, and Describe names this process.
func TestDescribeOwnSocket(t *testing.T) {
	c, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	a := c.LocalAddr().(*net.UDPAddr).AddrPort()
	hs, err := Holders(a)
	if err != nil {
		t.Skipf("no /proc: %v", err)
	}
	if len(hs) != 1 || hs[0].UID != os.Geteuid() {
		t.Fatalf("holders of %v: %+v", a, hs)
	}
	d := Describe(a)
	comm, _ := os.ReadFile("/proc/self/comm")
	if want := strings.TrimSpace(string(comm)); !strings.Contains(d, want) || !strings.HasPrefix(d, "uid ") {
		t.Errorf("Describe(%v) = %q, want the uid and %q", a, d, want)
	}
}
