package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/softrdma/softrdma/test/testenv"
)

// TestExecCQEx runs testdata/cqex.c through softrdma exec on rxe_lo:
// ibv_create_cq_ex refuses what rxe refuses with rxe's errno (wc_flags
// beyond IBV_WC_STANDARD_FLAGS, an unknown comp_mask bit and
// IGNORE_OVERRUN: EOPNOTSUPP; cqe 0 or above max_cqe, a completion vector
// out of range: EINVAL) and has the read_* ops of the wc_flags asked for;
// UD datagrams a QP sends to itself complete on one extended CQ with a
// completion channel (the event through ibv_req_notify_cq on
// ibv_cq_ex_to_cq) and are polled with ibv_start_poll/ibv_next_poll/
// ibv_end_poll in polls of up to three, mixed with ibv_poll_cq, each
// read_* value checked, none lost or twice; ibv_destroy_cq takes the CQ.
// A child of fork() does the same on a context of its own (through the
// parent) and gets EINVAL for the parent's CQ and context; the parent's
// CQ works after.
func TestExecCQEx(t *testing.T) {
	requireRDMACore(t)
	dir := execDir(t)
	prog := buildCTest(t, dir, "cqex")
	if !testenv.InNetns(t) {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd, out := startExec(t, ctx, dir, prog, "rxe_lo")
	err := cmd.Wait()
	out.wait("\x00") // the whole output
	t.Logf("cqex:\n%s", out)
	if err != nil {
		t.Fatalf("cqex: %v", err)
	}
	s := out.String()
	if strings.Contains(s, "FAIL") {
		t.Errorf("cqex failed a check")
	}
	for _, want := range []string{
		"ok parent wc_flags IBV_WC_EX_WITH_COMPLETION_TIMESTAMP EOPNOTSUPP",
		"ok parent cqe max_cqe+1 EINVAL",
		"ok parent comp_vector num_comp_vectors EINVAL",
		"ok parent ibv_get_cq_event: the extended CQ and its context",
		"ok parent receive 15 (",
		"ok parent 16 sends and 16 receives, through both polling calls",
		"ok parent ibv_destroy_cq(ibv_cq_ex_to_cq)",
		"ok child ibv_start_poll on the parent's CQ: EINVAL",
		"ok child 16 sends and 16 receives, through both polling calls",
		"ok parent the CQ after the child: ENOENT",
		"PASS",
	} {
		if !strings.Contains(s, want) {
			t.Errorf("output lacks %q", want)
		}
	}
}
