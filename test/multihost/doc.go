// Package multihost holds the multi-host integration tests of softrdma:
// real mckey processes in network namespaces (three hosts on a snooping
// Linux bridge with an IGMP querier), with AF_PACKET captures on every
// bridge port proving what went on the wire: IGMP reports for full members
// and none for send-only members, byte-valid RoCEv2 frames (ICRC recomputed
// from the captured headers), and multicast forwarded only to member ports.
//
// The tests need root (they create network namespaces) and skip otherwise.
// All traffic stays inside namespaces the tests create. When a test fails,
// its pcap files are kept: copied to $SOFTRDMA_ARTIFACTS when set, else to a
// directory under os.TempDir(); the test log names them.
package multihost
