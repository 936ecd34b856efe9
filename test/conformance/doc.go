// Package conformance is one suite of RDMA CM multicast cases written
// against the public API (rdmacm and verbs) and run on every backend:
// softrdma's RoCEv2 device on the host (go test ./test/conformance), its
// emulated InfiniBand subnet (TestConformanceIB), a kind of device that
// this package registers itself, as a provider would, without rdmacm
// knowing it (TestConformanceFakeKind, fakekind_test.go), and the kernel's
// Soft-RoCE in the QEMU guests of test/interop, through the
// rdmacore build (test/interop's TestKernelConformance copies the test
// binary into a guest). Each case asserts the behaviour documented for the
// backend it runs on (docs/interop.md, "differences from Linux"), so an undocumented
// difference fails. Every case prints one line:
//
//	CONFORMANCE <backend> <case> PASS|FAIL|SKIP <what was seen>
//
// The environment chooses the backend and addresses:
//
//	SOFTRDMA_CONFORMANCE_BACKEND  soft (default) or kernel
//	SOFTRDMA_CONFORMANCE_ADDR     the local address ids bind to (default 127.0.0.1)
//	SOFTRDMA_CONFORMANCE_UNREACH  an address without a route (the unreachable case)
package conformance
