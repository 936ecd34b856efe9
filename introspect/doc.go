// Package introspect is softrdma's observability: an opt-in, per-process
// introspection endpoint, Prometheus metrics, packet capture streaming and
// structured logs.
//
// softrdma's devices live inside processes, so rdma-core's tools
// (ibv_devinfo, rdma stat, saquery, tcpdump on an RDMA device) cannot see
// them. The endpoint gives the same visibility: devices and ports (GIDs,
// MTU, limits), QPs (state, Q_Key, attached groups), multicast groups
// (IP membership, reference counts, CM joins and their state), RDMA CM ids
// and event channels, and every device and QP counter, as JSON (emulated
// InfiniBand ports of provider/ib appear too, with their attributes,
// LIDs, GID, port counters, QPs and groups with their MLIDs and SA
// memberships); the same
// state as Prometheus metrics on /metrics; and a pcap stream of what the
// devices send and receive. The `softrdma devices|groups|stat|capture`
// subcommands read it.
//
// Off by default: nothing listens unless the program calls Start (or
// Serve), or calls FromEnv with SOFTRDMA_DEBUG_ADDR set. The endpoint
// listens on a Unix socket (mode 0600; by default
// $XDG_RUNTIME_DIR/softrdma-<pid>.sock or /tmp/softrdma-<pid>.sock, in
// $SOFTRDMA_DEBUG_DIR when that is set) or on
// a loopback TCP address, never elsewhere. On the socket only this
// user's processes and root are served; on TCP a request must name the
// endpoint in Host and carry its token (SOFTRDMA_DEBUG_TOKEN). A Client
// checks who listens on a socket and bounds every answer. See docs/security.md
// for the whole trust model. Connections that do not carry a whole,
// trusted request cannot keep one that does waiting: the endpoint accepts
// every connection at once, serves this user's socket peers at once, and
// reads the request header of any other (TCP, other users) within 10 to
// 20 s before it serves it or answers its error, keeping at most a
// quarter of RLIMIT_NOFILE (64 to 4096) of those open in the process and
// closing the oldest first (docs/security-endpoint.md). cmd/mckey calls
// FromEnv:
//
//	SOFTRDMA_DEBUG_ADDR=unix mckey -m 239.1.2.3 -b 127.0.0.1 &
//	softrdma devices -p $!
//
// Logs: EnableLogging (or SOFTRDMA_LOG=info with FromEnv) sends the RDMA
// CM's joins, leaves and errors, device and netdev events, and
// rate-limited drop reports to a log/slog logger; they are package
// logging's, which SOFTRDMA_LOG turns on in any rdmacm program.
package introspect
