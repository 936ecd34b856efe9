package interop

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/softrdma/softrdma/test/cconformance"
	"github.com/softrdma/softrdma/test/nettest"
)

// C programs on both sides: on the host through `softrdma exec` and
// softrdma's drop-in libraries in namespace h0, in a guest with rdma-core's
// own libraries on the kernel's rxe.

var execBuild struct {
	once       sync.Once
	bin, lib   string
	cprog      string
	err, cperr error
}

// softrdmaExec returns the softrdma binary and the directory of its
// libraries (softrdma exec -install), built once per run, and the C
// conformance program.
func softrdmaExec(t *testing.T) (bin, libdir, conformance string) {
	t.Helper()
	execBuild.once.Do(func() {
		dir, err := os.MkdirTemp(kernelBuildDir(t), "exec-")
		if err != nil {
			execBuild.err = err
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		execBuild.bin, execBuild.lib = filepath.Join(dir, "softrdma"), filepath.Join(dir, "lib")
		if out, err := exec.CommandContext(ctx, nettest.GoTool(), "build", "-o", execBuild.bin, "github.com/softrdma/softrdma/cmd/softrdma").CombinedOutput(); err != nil {
			execBuild.err = &buildError{"go build ./cmd/softrdma", err, out}
			return
		}
		if out, err := exec.CommandContext(ctx, execBuild.bin, "exec", "-install", execBuild.lib).CombinedOutput(); err != nil {
			execBuild.err = &buildError{"softrdma exec -install", err, out}
			return
		}
		execBuild.cprog, execBuild.cperr = cconformance.Build(ctx, dir)
	})
	if execBuild.err != nil {
		t.Fatal(execBuild.err)
	}
	if execBuild.cperr != nil {
		t.Fatal(execBuild.cperr)
	}
	return execBuild.bin, execBuild.lib, execBuild.cprog
}

type buildError struct {
	what string
	err  error
	out  []byte
}

func (e *buildError) Error() string { return e.what + ": " + e.err.Error() + "\n" + string(e.out) }

// kernelBuildDir is the run's folder of host-built binaries.
func kernelBuildDir(t *testing.T) string {
	kernelBuild.once.Do(func() {
		kernelBuild.dir, kernelBuild.err = os.MkdirTemp("", "softrdma-interop-kbin-")
	})
	if kernelBuild.err != nil {
		t.Fatal(kernelBuild.err)
	}
	return kernelBuild.dir
}

// TestCConformance runs the C conformance program (test/cconformance) at
// once on softrdma in h0 through softrdma exec and on the kernel's rxe in
// g1 with rdma-core's libraries (the binary built on the host: the guest
// is Debian 12 too), and compares their lines: they must agree except for
// cconformance.Differences, each documented. The guest's lines must also
// be the recorded testdata/kernel.txt, which TestOnSoftrdma holds
// softrdma's run on loopback to.
func TestCConformance(t *testing.T) {
	l := needLab(t)
	note := report(t)
	g := l.guests[0]
	bin, libdir, prog := softrdmaExec(t)
	const unreach = "192.0.2.1" // neither h0 nor the guest has a route but its /24
	gc := g.start(t, "conformance (rdma-core, rxe0)", "exec timeout -s KILL 150 "+g.install(t, prog)+" -a "+g.addr.String()+" -u "+unreach+" -g 71")
	// The program's stdout into a file, its stderr (and softrdma's) into
	// the process's log.
	hostOut := filepath.Join(t.TempDir(), "conformance.out")
	hp := startProc(t, l.h0, "/bin/sh", "-c", "exec "+bin+" exec -libdir "+libdir+" -- "+prog+" -a "+l.hostAddr.String()+" -u "+unreach+" -g 72 >"+hostOut)
	hp.ExpectExit(0, exitTimeout)
	gc.expectExit(0, exitTimeout)
	b, err := os.ReadFile(hostOut)
	if err != nil {
		t.Fatal(err)
	}
	soft, kernel := string(b), gc.stdout()
	if diffs := cconformance.Compare(soft, kernel); len(diffs) > 0 {
		t.Errorf("softrdma (h0, softrdma exec) and the kernel (%s, rdma-core) differ beyond the documented differences:\n%s\nsoftrdma:\n%s\nkernel:\n%s",
			g.name, nettest.Indent(strings.Join(diffs, "\n")), nettest.Indent(soft), nettest.Indent(kernel))
	}
	if kernel != cconformance.Kernel {
		t.Errorf("the kernel's lines are not test/cconformance/testdata/kernel.txt (write them there when the program changed):\n%s", kernel)
	}
	note.set("C conformance program: %d lines, softrdma (softrdma exec, h0) = kernel rxe (rdma-core, %s) but the %d documented differences",
		strings.Count(kernel, "\n"), g.name, len(cconformance.Differences))
}
