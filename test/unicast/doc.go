// Package unicast tests multicast request / unicast reply between real
// softrdma processes: several processes on one host share UDP port 4791,
// so a unicast reply reaches whichever process the kernel picks, and
// provider/rxe forwards it to the process that owns the destination QPN.
//
// Every process is test/testcmd/mcreply, an RDMA CM full member that
// multicasts requests and answers each request it receives with a unicast
// UD send whose address handle comes from the receive completion. The
// processes run in network namespaces the tests create (root is needed;
// the tests skip otherwise): three on one host's loopback, and three on
// one host plus one on another, connected by a veth pair. Nothing is sent
// on any other interface.
package unicast
