package interop

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/softrdma/softrdma/test/nettest"
	"github.com/softrdma/softrdma/test/pyverbs"
)

// pyverbsTimeout bounds the suite's run in the guest (about a minute
// under TCG on the loaded 2-core machine).
const pyverbsTimeout = 8 * time.Minute

// pyverbsScript runs the suite (%[2]s: the runner and its arguments,
// killed after %[1]d s) in a mount namespace of its own where rxe0 has the
// link to its netdev the suite looks for (ls
// /sys/class/infiniband/rxe0/device/net/): a hardware RoCE device has it
// (device is its PCI function), Linux 6.1's rxe has no device link at
// all, and without it every test_rdmacm test skips ("Device rxe0 doesn't
// have net interface"). The view is a tmpfs over /sys/class/infiniband
// whose rxe0 links every entry of the real one and adds device/net/eth0,
// as softrdma exec's sysfs view shows rxe_lo's. The namespace also gets
// the /dev/shm the guest lacks (the rdmacm tests' multiprocessing needs it).
const pyverbsScript = `cd /ctl/pyverbs && exec unshare -m sh -c '
set -e
real=$(readlink -f /sys/class/infiniband/rxe0)
mkdir -p /run/ibview
mount -t tmpfs ibview /run/ibview
mkdir -p /run/ibview/rxe0/device/net
for f in "$real"/*; do [ "${f##*/}" = device ] || ln -s "$f" /run/ibview/rxe0/; done
ln -s /sys/class/net/eth0 /run/ibview/rxe0/device/net/eth0
mount --bind /run/ibview /sys/class/infiniband
mkdir -p /dev/shm
mount -t tmpfs shm /dev/shm
exec timeout -s KILL %[1]d python3 %[2]s'`

// TestPyverbs runs rdma-core's own Python tests (test/pyverbs's Modules,
// the host's copy of python3-pyverbs's /usr/share/doc/rdma-core/tests,
// which the guest image strips) in g1 on the kernel's rxe0 with the
// guest's pyverbs and rdma-core libraries, and holds each test's outcome
// to the kernel column of test/pyverbs/testdata/outcomes.md; the softrdma
// column is test/pyverbs's TestPyverbsOnSoftrdma's (softrdma exec on the
// host). SOFTRDMA_PYVERBS_WRITE_TABLE=1 rewrites the kernel column.
func TestPyverbs(t *testing.T) {
	l := needLab(t)
	note := report(t)
	if err := pyverbs.Available(); err != nil {
		if required {
			t.Fatalf("the suite's copy comes from the host: %v", err)
		}
		t.Skipf("the suite's copy comes from the host: %v", err)
	}
	g := l.guests[0]
	t0 := time.Now()
	dir := filepath.Join(g.share, "pyverbs")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := pyverbs.Prepare(dir); err != nil {
		t.Fatal(err)
	}
	hostVer, err := exec.Command("dpkg-query", "-W", "-f", "${Version}", "python3-pyverbs").Output()
	if err != nil {
		t.Fatalf("dpkg-query python3-pyverbs: %v", err)
	}
	guestVer := strings.TrimSpace(g.run(t, "dpkg-query -W -f '${Version}' python3-pyverbs"))
	if guestVer != string(hostVer) {
		t.Errorf("python3-pyverbs %s on the host (the suite), %s in the guest (the library): the table is one version's", hostVer, guestVer)
	}
	const dev = "rxe0"
	// rxe0's IPv4 RoCEv2 GID (the kernel's table: fe80:: v1 and v2, then
	// the address's v1 and v2).
	// One grep over the 1024 entries: a process per entry takes a
	// minute under TCG.
	gid, err := strconv.Atoi(strings.TrimSpace(g.run(t, `p=/sys/class/infiniband/rxe0/ports/1
for f in $(grep -l '^0000:0000:0000:0000:0000:ffff:' $p/gids/*); do
	n=${f##*/}
	[ "$(cat $p/gid_attrs/types/$n 2>/dev/null)" = "RoCE v2" ] && echo $n
done | sort -n | head -n 1`)))
	if err != nil {
		t.Fatalf("rxe0's IPv4 RoCEv2 GID index: %v", err)
	}
	t.Logf("the suite copied, the versions and the GID index found in %.1fs", time.Since(t0).Seconds())
	args := pyverbs.Args("/ctl/pyverbs", dev, gid, "/ctl/pyverbs/results.txt")
	start := time.Now()
	c := g.start(t, "pyverbs (rdma-core, rxe0)", fmt.Sprintf(pyverbsScript, int(pyverbsTimeout.Seconds()), strings.Join(args, " ")))
	rc := c.wait(pyverbsTimeout + time.Minute)
	took := time.Since(start)
	b, err := os.ReadFile(filepath.Join(dir, "results.txt"))
	if err != nil {
		t.Fatalf("%v (exit status %d):\n%s", err, rc, nettest.Indent(c.output()))
	}
	res, err := pyverbs.Parse(string(b), dev)
	if err != nil {
		t.Fatalf("results (exit status %d): %v\n%s", rc, err, nettest.Indent(string(b)))
	}
	diffs, err := pyverbs.Check(pyverbs.Kernel, res)
	if err != nil {
		t.Fatal(err)
	}
	if len(diffs) > 0 {
		t.Errorf("outcomes on the kernel's rxe differ from test/pyverbs/testdata/outcomes.md's kernel column (%s=1 rewrites it):\n\t%s\nresults:\n%s",
			pyverbs.WriteEnv, strings.Join(diffs, "\n\t"), nettest.Indent(string(b)))
	}
	t.Logf("%d tests in %.1fs on %s's rxe0 (python3-pyverbs %s, exit status %d); the results:\n%s",
		len(res), took.Seconds(), g.name, guestVer, rc, nettest.Indent(string(b)))
	k := res.Counts()
	note.set("rdma-core's pyverbs tests on %s's rxe0 (%.0fs): %d tests: %d ok, %d skip, %d ERROR, %d FAIL; as test/pyverbs/testdata/outcomes.md has them: %v",
		g.name, took.Seconds(), len(res), k["ok"], k["skip"], k["ERROR"], k["FAIL"], len(diffs) == 0)
}
