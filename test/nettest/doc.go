// Package nettest is the harness shared by softrdma's integration tests
// (test/multihost and test/interop): named network namespaces (naming,
// sweeping the leftovers of dead runs, deletion), running code inside a
// namespace on a locked OS thread, AF_PACKET captures written to pcap files
// that are kept when a test fails, IPv4/IGMP/RoCEv2 frame parsing, the
// bridge's multicast database, and processes run inside a namespace whose
// output the tests wait on.
//
// It is meant for tests only; most helpers take a testing.TB and fail the
// test on error. Everything here needs root and iproute2.
package nettest
