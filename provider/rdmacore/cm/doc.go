// Package cm is the kernel's RDMA CM through rdma-core's librdmacm: event
// channels and CM ids of addresses that a kernel RDMA device owns, as an
// engine of the rdmacm package (rdmacm/engine), which it registers when
// imported. Like its parent, provider/rdmacore (the verbs backend), it
// exists only in builds with the rdmacore tag and cgo.
package cm
