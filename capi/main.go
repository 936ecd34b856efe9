// Command capi is softrdma's librdmacm and libibverbs for C programs: built
// with -buildmode=c-shared and the capi build tag it is
// libsoftrdma-capi.so, and two thin C libraries, librdmacm.so.1 and
// libibverbs.so.1, put it in place of rdma-core's libraries for a
// dynamically linked program (softrdma exec; capi/capibuild builds all
// three).
//
// # One Go runtime
//
// A program loads librdmacm.so.1 and libibverbs.so.1, but only
// libsoftrdma-capi.so holds Go code. The two thin libraries have rdma-core's
// sonames and export every symbol rdma-core's libraries export, with the
// same symbol versions (RDMACM_1.0 … 1.3, IBVERBS_1.0 … 1.14 and
// IBVERBS_PRIVATE_34, defaults and compat ones as readelf shows them); each
// symbol is a jump to softrdma_<name> in libsoftrdma-capi.so, which both
// thin libraries name as DT_NEEDED (with an $ORIGIN run path). The loader
// maps it once, so the process has one Go runtime and one set of devices,
// however many of the two libraries it loads and in which order.
//
// # Layouts
//
// The C side (verbs.c, rdmacm.c, stubs.c) is compiled against the
// distribution's <infiniband/verbs.h> and <rdma/rdma_cma.h>
// (libibverbs-dev, librdmacm-dev), so the structs a program reads are the
// ones its own compiler laid out; a static assertion checks every
// implemented call against the header's prototype. The context is an
// extended one (struct verbs_context, abi_compat set), its ops table holds
// poll_cq, req_notify_cq, post_send, post_recv and query_port, so the
// inline functions of verbs.h (ibv_post_send, ibv_poll_cq, …) reach
// softrdma; the extended ops left NULL make the inline ones return
// EOPNOTSUPP, as rdma-core does for a provider without them.
//
// # Objects
//
// Every object handed to C (device, context, PD, MR, CQ, completion
// channel, QP, AH, event channel, CM id, CM event) is a malloc'd C struct:
// rdma-core's struct followed by a handle (a number in a Go table) of the
// Go object behind it (a *verbs.PD, *rdmacm.ID, …). No Go pointer is ever
// stored in C memory. Go objects that C programs reach from another object
// (the context of an id, its QP, the CQs rdma_create_qp made) get their C
// struct on first use, kept in a Go map from the Go object to it. Memory a
// program registers stays C memory: the MR is a Go slice over it.
//
// # Asynchronous events
//
// A context's async_fd is an eventfd with EFD_SEMAPHORE. When the C
// context is made (ibv_open_device, or the first use of a context rdma_cm
// made) a goroutine starts that takes each event of
// Context.GetAsyncEvent, queues it and adds one to async_fd, so
// poll(async_fd) is readable exactly while events are queued, before any
// ibv_get_async_event too. ibv_get_async_event reads async_fd (waiting,
// or EAGAIN when the program set O_NONBLOCK), takes one queued event and
// fills event_type (libibverbs' values) and element.port_num for port
// events. ibv_ack_async_event acknowledges the oldest unacknowledged
// event of the same type and port (it is given no context).
// ibv_close_device stops the goroutine and waits for it before async_fd
// is closed (async.go).
//
// # Errors
//
// The Go side returns an errno; C turns it into the call's convention
// (0/-1 and errno for librdmacm, an errno or NULL and errno for
// libibverbs). A symbol without an implementation prints one line on
// stderr naming the call, once per process, and returns the errno
// rdma-core gives for an operation the device does not support
// (EOPNOTSUPP), with errno set.
//
// Without the capi tag this is an empty program, so that go build ./...
// and go vet ./... need neither cgo nor the rdma-core headers.
//go:generate go run gen_stubs.go

package main

func main() {}
