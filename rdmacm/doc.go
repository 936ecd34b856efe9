// Package rdmacm is librdmacm's RDMA Communication Manager for multicast,
// in Go: event channels, CM ids, bind and resolve, joins as full member or
// send-only full member (rdma_join_multicast_ex), leaves, events and acks,
// the rdma_verbs.h helpers and rdma_getaddrinfo. Each call is the C call
// of the same name with its argument checks, its state rules and its
// errno, so a C program ports line by line: rdma_create_event_channel is
// CreateEventChannel, rdma_create_id is CreateID, rdma_join_multicast_ex
// is (*ID).JoinMulticastEx, and so on.
//
// # Devices
//
// The package names no kind of device. A program imports the kinds it
// wants, as a C program links librdmacm's providers:
//
//	import _ "github.com/softrdma/softrdma/provider/all"
//
// gives softrdma's RoCEv2 device of every network interface, InfiniBand
// ports on an emulated subnet (SOFTRDMA_SM) and, in builds with the
// rdmacore tag, the kernel's RDMA devices. An id bound to a local address
// uses the device that address belongs to (verbs.Host.DeviceForAddr); a
// program without any provider has no devices (EADDRNOTAVAIL naming the
// address).
//
// # Engines
//
// The package is the front: ids, channels, event queues and acks, the QP
// of an id and its attach when a join's event is retrieved. The work of an
// id goes to its engine: softrdma's own (the kernel's cma.c over
// softrdma's devices) or, for an id whose address a kernel RDMA device
// owns, the kernel's CM through librdmacm (SetBackend, SOFTRDMA_BACKEND).
//
// # Errors and events
//
// Every error is a *verbs.Error carrying the C call, what it was about,
// the errno (errors.Is(err, syscall.EINVAL) works) and, when the errno
// does not say it all, the cause in words. Every event from GetEvent must
// be acked; LeaveMulticast and Destroy wait for the acks of events already
// retrieved and drop those not retrieved. A nil channel makes a
// synchronous id whose calls wait for their event.
//
// SOFTRDMA_LOG (package logging) turns on structured logs of joins,
// leaves, errors and drops in any program that uses the package.
package rdmacm
