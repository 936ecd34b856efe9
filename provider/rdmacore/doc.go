// Package rdmacore is the backend over the kernel's RDMA stack: rdma-core's
// libibverbs for the verbs objects (devices, PDs, MRs, CQs, QPs, AHs) and
// librdmacm for the CM ids of addresses that a kernel RDMA device owns
// (an RDMA NIC, or the kernel's Soft-RoCE rdma_rxe).
//
// It exists only in builds with the build tag rdmacore and cgo enabled
// (go build -tags rdmacore), linking librdmacm and libibverbs (Debian:
// librdmacm-dev, libibverbs-dev; rdma-core 44 or newer). Without the tag
// the package is empty and softrdma uses only its software devices; the
// tag with CGO_ENABLED=0 fails the build (nocgo.go) rather than leave the
// kernel's stack out without a word. Its CM half is provider/rdmacore/cm.
//
// The package registers a driver.Provider, so verbs.DeviceList lists the
// kernel's devices next to the software ones; the rdmacm package uses its
// CM part for ids bound to a kernel device's address. On, IsKernelDevice
// and OwnerOf tell which devices and addresses are the kernel's.
//
// # Objects
//
// Every verbs object is its libibverbs object; errors are *verbs.Error
// values naming the C call and carrying the errno libibverbs returned or
// set. The kernel decides what it decides in C: a PD still used by MRs,
// QPs or AHs and a CQ still used by a QP are refused with EBUSY. A context
// is different: ibv_close_device would free everything of it, so Close
// refuses with EBUSY while PDs or CQs of the context exist. Freeing an
// object twice gives EINVAL. Only UD QPs are made (other types:
// EOPNOTSUPP); their CQs and the AHs of their sends must be this
// backend's, of the same context (EINVAL otherwise).
//
// The device list of libibverbs is kept for the life of the process, and
// so is one context per device that answers DeviceOps.Attr and OwnerOf.
// Closing a verbs.Host unregisters its kernel devices; contexts opened on
// them stay open until closed.
//
// # Memory
//
// A registered memory region is Go memory that the kernel and the
// provider library use after ibv_reg_mr returned: RegMR pins the buffer
// with a runtime.Pinner, as the cgo pointer rules require, and Dereg
// unpins it. Keep the slice registered while a posted work request may
// use it. Work requests are converted into C arrays made with each QP
// (sized by its caps), completions polled into C arrays made with each
// CQ: posting and polling allocate nothing.
//
// # Completions
//
// Each CQ has its own completion channel, whose descriptor is
// non-blocking and waited on through Go's netpoller: CQ.Wait blocks no OS
// thread and ends with ctx.Err() when its context ends. Verbs cannot
// count a CQ's completions without polling them, so Wait and Len poll
// completions into a per-CQ stash (as large as the CQ) that Poll returns
// first, in the CQ's order; Len is exact unless more completions are
// outstanding than the CQ holds.
//
// # Multicast
//
// QP.AttachMcast is ibv_attach_mcast: on RoCE it programs the device's
// multicast filter only. Datagrams of a group reach the device only while
// the host is a member of the IP group (IGMP/MLD), which rdma_join_multicast
// (the rdmacm package) arranges; an application attaching by hand joins
// the group itself (e.g. net.ListenMulticastUDP on the GID's interface).
package rdmacore
