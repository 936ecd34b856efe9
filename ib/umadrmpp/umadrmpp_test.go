package umadrmpp

import (
	"bytes"
	"context"
	"debug/elf"
	"encoding/hex"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/softrdma/softrdma/ib/mad"
	"github.com/softrdma/softrdma/test/testenv"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func needCC(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("cc"); err != nil {
		testenv.Require(t, "no C compiler (cc): %v", err)
	}
	if _, err := os.Stat("/usr/include/infiniband/umad.h"); err != nil {
		testenv.Require(t, "no <infiniband/umad.h> (apt-get install libibumad-dev): %v", err)
	}
}

// TestBuild: the library builds and exports what it interposes.
func TestBuild(t *testing.T) {
	needCC(t)
	lib, err := Build(context.Background(), t.TempDir(), "")
	if err != nil {
		t.Fatal(err)
	}
	f, err := elf.Open(lib)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	syms, err := f.DynamicSymbols()
	if err != nil {
		t.Fatal(err)
	}
	have := map[string]bool{}
	for _, s := range syms {
		if s.Section != elf.SHN_UNDEF {
			have[s.Name] = true
		}
	}
	for _, want := range []string{"read", "umad_send", "umad_recv", "umad_poll"} {
		if !have[want] {
			t.Errorf("%s does not define %s", lib, want)
		}
	}
	if got := Preload("/u/libumad2sim.so", lib); got != "/u/libumad2sim.so:"+lib {
		t.Errorf("Preload: %q", got)
	}
	if got := Preload("/u/libumad2sim.so", ""); got != "/u/libumad2sim.so" {
		t.Errorf("Preload without the library: %q", got)
	}
}

// TestBuildRefuses: no compiler is ErrNoCompiler; a directory others can
// write, or none, is refused before anything is built in it.
func TestBuildRefuses(t *testing.T) {
	if _, err := Build(context.Background(), t.TempDir(), "/nonexistent/cc"); !errors.Is(err, ErrNoCompiler) {
		t.Errorf("a missing compiler: %v, want ErrNoCompiler", err)
	}
	needCC(t)
	open := filepath.Join(t.TempDir(), "open")
	if err := os.Mkdir(open, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(open, 0o777); err != nil {
		t.Fatal(err)
	}
	for _, dir := range []string{open, filepath.Join(t.TempDir(), "missing")} {
		if lib, err := Build(context.Background(), dir, ""); err == nil {
			t.Errorf("built %s in %s", lib, dir)
		} else {
			t.Logf("%s: %v", dir, err)
		}
	}
	if _, err := os.Stat(filepath.Join(open, LibName)); err == nil {
		t.Errorf("%s was built in a directory others can write", LibName)
	}
}

// TestLoopback runs the library against a stand-in libibumad that loops
// every MAD it is given back to umad_recv: an RMPP-active SA answer sent
// with umad_send comes out as the kernel's segments (those of
// mad.RMPPSegments, RRespTime 0), and umad_recv gives it back whole as
// saquery reads it: ENOSPC with the length needed for a 256-byte buffer,
// then the MAD; the ACKs it sent to itself never reach the program.
func TestLoopback(t *testing.T) {
	needCC(t)
	dir := t.TempDir()
	lib, err := Build(context.Background(), dir, "")
	if err != nil {
		t.Fatal(err)
	}
	cc := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("cc", args...).CombinedOutput(); err != nil {
			t.Fatalf("cc %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	cc("-shared", "-fPIC", "-o", filepath.Join(dir, "libfakeumad.so"), "testdata/fakeumad.c")
	prog := filepath.Join(dir, "loop")
	cc("-o", prog, "testdata/loop.c", "-L"+dir, "-lfakeumad", "-Wl,-rpath,"+dir)
	for _, data := range []int{0, 168, 200, 280, 616, 4000} {
		cmd := exec.Command(prog, strconv.Itoa(data))
		cmd.Env = append(os.Environ(), "LD_PRELOAD="+lib)
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("%d bytes: %v\n%s", data, err, out)
		}
		var sent [][]byte
		var recvs []string
		var whole []byte
		for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			f := strings.Fields(l)
			switch f[0] {
			case "send":
				b, _ := hex.DecodeString(f[2])
				sent = append(sent, b)
			case "recv":
				recvs = append(recvs, strings.Join(f[1:], " "))
			case "mad":
				whole, _ = hex.DecodeString(f[1])
			}
		}
		// What the program sent, and the segments the kernel would send.
		orig := make([]byte, mad.SAHeaderEnd+data)
		orig[0], orig[1], orig[2], orig[3] = 1, 3, 2, 0x92
		orig[8], orig[15], orig[17], orig[26], orig[45] = 0xab, 7, 0x38, 1, 7
		for i := range data {
			orig[mad.SAHeaderEnd+i] = byte(i % 251)
		}
		hdr := mad.MAD(make([]byte, mad.Len))
		copy(hdr, orig)
		want := mad.RMPPSegments(hdr, orig[mad.SAHeaderEnd:])
		var segs, acks int
		for _, s := range sent {
			m := mad.MAD(s)
			switch {
			case len(s) == mad.Len && m.RMPPType() == mad.RMPPTypeData:
				w := bytes.Clone(want[segs])
				w[26] &= 7 // RRespTime: the kernel's 0, softsm's SA's 0x1F
				if !bytes.Equal(s, w) {
					t.Errorf("%d bytes: segment %d\n got % x\nwant % x", data, segs+1, s[:64], w[:64])
				}
				segs++
			case m.RMPPType() == mad.RMPPTypeAck:
				if m.Method() != 0x12 || m.TID() != 0xab00_0000_0000_0007 || m.SegmentNumber() == 0 {
					t.Errorf("%d bytes: ACK method %#x TID %#x segment %d", data, m.Method(), m.TID(), m.SegmentNumber())
				}
				acks++
			default:
				t.Errorf("%d bytes: sent % x…", data, s[:36])
			}
		}
		if segs != len(want) || acks == 0 {
			t.Errorf("%d bytes: %d segments (want %d), %d ACKs", data, segs, len(want), acks)
		}
		n := len(orig)
		wantRecv := []string{fmtRecv(-28, 28, n), fmtRecv(2, 0, n), "-110 110"} // ENOSPC, whole, timeout
		if n <= mad.Len {
			wantRecv = []string{fmtRecv(2, 0, n), "-110 110"}
		}
		if strings.Join(recvs, ",") != strings.Join(wantRecv, ",") {
			t.Errorf("%d bytes: umad_recv gave %q, want %q", data, recvs, wantRecv)
		}
		got := bytes.Clone(whole)
		if len(got) > 26 {
			got[26] &= 7
			// The first segment's RMPP header: DATA, First (and Last),
			// PayloadLength of the transfer.
			copy(got[24:36], orig[24:36])
		}
		if !bytes.Equal(got, orig) {
			t.Errorf("%d bytes: reassembled %d bytes, want %d, equal to what was sent", data, len(whole), len(orig))
		}
		t.Logf("%d bytes of records: %d segments, %d ACKs, umad_recv %q", data, segs, acks, recvs)
	}
}

func fmtRecv(r, errno, n int) string {
	return strconv.Itoa(r) + " " + strconv.Itoa(errno) + " " + strconv.Itoa(n)
}
