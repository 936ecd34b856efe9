// Package mcast is reliable multicast for Go programs over RDMA UD
// multicast: a group of members, each of which sends messages to the
// group and receives every other member's, in order, whole, once, with
// flow control — on every kind of device softrdma has (the software
// RoCEv2 device, the emulated InfiniBand subnet, and the kernel's RDMA
// devices in a build with the rdmacore tag).
//
//	c, err := mcast.Join(ctx, netip.MustParseAddr("239.1.2.3"),
//		&mcast.Options{Local: netip.MustParseAddr("10.0.0.1")})
//	defer c.Close()
//	c.WaitReceivers(ctx, 2)                  // a sender: wait for its receivers
//	c.Send(ctx, []byte("hello"))             // to every member
//	n, from, err := c.Receive(ctx, buf)      // from any member, in its order
//
// Join does what a librdmacm program does by hand (an id bound to the
// local address, a UD QP with its CQs, receive buffers with their 40-byte
// GRH area, rdma_join_multicast_ex, the MULTICAST_JOIN event, an address
// handle, the Q_Key) and Close undoes it. A program imports the kinds of
// device it uses, as with rdmacm: _ "github.com/softrdma/softrdma/provider/all".
//
// # Semantics
//
//   - Messages of any size up to Options.MaxMessageSize (1 MiB by
//     default, at most 64 MiB); Receive gives whole messages, each
//     sender's in its order, each once. SendBatch packs small messages
//     into shared packets (Send sends each message's last packet at once,
//     for latency).
//   - A member receives a sender's stream from where it found it (the
//     live edge): a receiver that joins late gets everything from its
//     first whole message on, without gap. A sender whose first messages
//     must reach members still joining calls WaitReceivers first.
//   - Flow control: a sender sends at most Options.Window packets beyond
//     its slowest receiver's position; Send waits (ctx, the write
//     deadline) while the window is full. With Options.MaxStall a receiver
//     that keeps the sender blocked more than half of a period of MaxStall
//     is dropped from the window: its Receive reports ErrEvicted and it
//     goes on at the live edge.
//   - A sender silent for Options.PeerTimeout is gone: its receivers get
//     what they hold, then a *PeerError with ErrPeerGone. A receiver
//     silent as long stops counting in its senders' windows.
//   - Close waits up to Options.Linger until every receiver has acked the
//     stream and knows it ended, then leaves; it never hangs. A receiver
//     that closed stops counting at once, and its senders' Close does not
//     wait for it: it sends nothing after its Leave, and a sender ignores
//     its Status that arrives after its Leave.
//   - Options.Unreliable gives raw datagrams instead: one message per UD
//     datagram of at most MTU bytes, no header, no repair, no order —
//     what mckey and any other UD program on the group send and receive.
//
// # Protocol
//
// NACK-based, receiver-driven repair with positive acknowledgements for
// flow control only (package mcast/internal/proto has the packets and the
// state machine; docs/reliable.md the reasoning against NORM, PGM, Aeron
// and UCC):
//
//   - A sender's messages are a stream of records (a uvarint length, then
//     the bytes) cut into packets of the path MTU; every packet carries
//     the sender's session (a random 32-bit identity), a 64-bit sequence
//     number and where its first record starts (so a receiver can start
//     mid-stream). A receiver keeps a window of packets per sender and
//     reads the stream in sequence order.
//   - A receiver that sees a gap waits a random delay (up to 300 µs) and
//     sends a NACK over unicast UD to the sender; a repair it sees
//     meanwhile cancels it (suppression). It asks again after a repair
//     timeout (4 ms, doubling).
//   - The sender answers the first NACK for a packet with a unicast
//     repair to that receiver; a second receiver asking for the same
//     packet within half a repair timeout gets a multicast repair, which
//     answers every other one too; further NACKs in that time are
//     suppressed. So repairs track the packets lost, not the group's size.
//   - Heartbeats (1 ms after the last packet, doubling to 100 ms) carry
//     the next sequence number and the oldest one the sender still holds,
//     so a lost tail is noticed and a loss beyond repair is reported
//     (ErrLost) rather than waited for.
//   - Receivers report their position and window (Status) every quarter
//     window, when a heartbeat asks, and every 50 ms; the sender's window
//     follows the slowest. A new receiver says Hello and delivers nothing
//     until the sender's Welcome tells it from where the sender holds the
//     stream for it, so joining never reports a false loss.
//   - A member's session is bound to the address and QPN it first came
//     from; packets claiming it from elsewhere are dropped and counted.
package mcast
