//go:build rdmacore && !cgo

package rdmacore

// The rdmacore tag asks for the kernel's RDMA stack through rdma-core,
// which needs cgo: a build with CGO_ENABLED=0 fails here instead of
// leaving the kernel backend out without a word.
var _ = the_rdmacore_build_tag_needs_cgo__build_with_CGO_ENABLED_1_and_librdmacm_dev_libibverbs_dev
