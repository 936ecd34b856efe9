// Package cm is the kernel's RDMA CM through rdma-core's librdmacm: event
// channels and CM ids of addresses that a kernel RDMA device owns, as an
// the rdmacm package's kernel CM (rdmacm/kernelcm), which it registers when
// imported. Like its parent, provider/rdmacore (the verbs backend), it
// exists only in builds with the rdmacore tag and cgo.
package cm
