package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/softrdma/softrdma/test/testenv"
)

// TestExecQueryDeviceEx runs testdata/querydevex.c through softrdma exec
// on rxe_lo: ibv_query_device_ex (an inline of verbs.h that calls the
// context's query_device_ex, else falls back to ibv_query_device and
// leaves the extended attributes zero) gives phys_port_cnt_ex equal to
// phys_port_cnt, and in orig_attr what ibv_query_device gives, as
// rdma-core's providers do.
func TestExecQueryDeviceEx(t *testing.T) {
	requireRDMACore(t)
	dir := execDir(t)
	prog := buildCTest(t, dir, "querydevex")
	if !testenv.InNetns(t) {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd, out := startExec(t, ctx, dir, prog)
	err := cmd.Wait()
	out.wait("\x00") // the whole output
	t.Logf("querydevex:\n%s", out)
	if err != nil {
		t.Fatalf("querydevex: %v", err)
	}
	for _, want := range []string{"rxe_lo phys_port_cnt=1 phys_port_cnt_ex=1", "ok"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q", want)
		}
	}
}
