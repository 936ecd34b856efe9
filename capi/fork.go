//go:build capi

package main

/*
#include <capi.h>
void sr_fork_reset(void);
void sr_fork_add_ctx(struct sr_context *c);
void sr_fork_add_qp(struct sr_qp *q);
*/
import "C"

// srForkPrepare notes every C context and QP of the process for fork.c's
// child handler, which makes their inline calls fail in the child of a
// fork() (see fork.c). It runs in the parent, in the thread that calls
// fork(), before the fork.
//
//export srForkPrepare
func srForkPrepare() {
	C.sr_fork_reset()
	reg.mu.Lock()
	for _, cc := range reg.ctxs {
		C.sr_fork_add_ctx(cc)
	}
	reg.mu.Unlock()
	reg.objs.Range(func(_, v any) bool {
		if q, ok := v.(*cqp); ok {
			C.sr_fork_add_qp(q.c)
		}
		return true
	})
}
