// Package rdmacore is the backend over the kernel's RDMA stack: rdma-core's
// libibverbs for the verbs objects (devices, PDs, MRs, CQs, QPs, AHs) and
// librdmacm for the CM ids of addresses that a kernel RDMA device owns
// (an RDMA NIC, or the kernel's Soft-RoCE rdma_rxe).
//
// It exists only in builds with the build tag rdmacore and cgo enabled
// (go build -tags rdmacore), linking librdmacm and libibverbs (Debian:
// librdmacm-dev, libibverbs-dev; rdma-core 44 or newer). Without the tag,
// or with CGO_ENABLED=0, the package is empty and softrdma uses only its
// software devices.
//
// The package registers a verbs.Provider, so verbs.DeviceList lists the
// kernel's devices next to the software ones; the rdmacm package uses its
// CM part for ids bound to a kernel device's address.
package rdmacore
