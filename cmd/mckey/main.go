// Command mckey is a port of rdma-core's mckey: it joins an RDMA multicast
// group through the RDMA CM and sends or receives UD datagrams on it.
//
// Flags, output lines and exit statuses follow rdma-core's mckey:
//
//	mckey -m 239.1.1.1 -b 127.0.0.1            # receiver (server)
//	mckey -m 239.1.1.1 -b 127.0.0.1 -s         # sender (client)
//
// Options: -m multicast_address, -M unmapped_multicast_address (needs -b),
// -s sender, -b bind_address, -c connections, -C message_count,
// -S message_size, -p port_space (0x111 UDP, 0x2 IPoIB), -o join as a
// send-only full member, -l create the QP with BLOCK_SELF_MCAST_LB.
// They are parsed as glibc's getopt does (see getopt): non-option
// arguments, which mckey ignores, may come between options; "--" ends the
// options. A host name that does not resolve prints getaddrinfo's reason
// for it (gai_strerror) and returns its EAI code, as rdma-core does.
//
// Extensions (not in rdma-core's mckey):
//
//	--iface NAME      bind to the first IPv4 address of interface NAME (when -b is absent)
//	--timeout D       receiver gives up after D without a message (e.g. 5s); exit status -110
//	--no-imm          send SEND without immediate data (rdma-core always sends SEND_WITH_IMM)
//	--verify          receiver checks every completion: status, byte_len = 40 + size,
//	                  the payload pattern softrdma's mckey sends, and imm = sender QPN
//	--join-pause D    pause after joining instead of 3s
//	--pcap FILE       write every frame the process's devices send and receive to a pcap
//	                  file (Ethernet/IP/UDP/RoCEv2 with the real ICRC; tshark decodes port 4791)
//
// Environment (extensions): SOFTRDMA_DEBUG_ADDR=unix turns on the
// introspection endpoint that `softrdma devices|groups|stat|capture -p PID`
// read; SOFTRDMA_LOG=info sends structured logs to stderr (package
// introspect).
//
// Unlike C's stdio, every line is written at once, so a test can wait for
// the joined line of a receiver before it starts a sender.
package main

import (
	// Every kind of device (RoCEv2, InfiniBand, the kernel's with the rdmacore tag).
	_ "github.com/softrdma/softrdma/provider/all"

	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sync/atomic"
	"syscall"
	"time"
)

func main() {
	// SIGINT and SIGTERM cancel the run: mckey leaves its groups, closes
	// its devices and its introspection endpoint (removing the socket),
	// then dies of the same signal, so its parent sees the status
	// rdma-core's mckey, which handles no signal, gives.
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	ctx, cancel := context.WithCancel(context.Background())
	var got atomic.Value
	go func() {
		if s, ok := <-sigs; ok {
			got.Store(s)
			cancel()
		}
	}()
	code := runContext(ctx, os.Args, lineWriter{os.Stdout}, lineWriter{os.Stderr})
	if s, ok := got.Load().(syscall.Signal); ok {
		signal.Reset(s)
		syscall.Kill(os.Getpid(), s)
		time.Sleep(time.Second) // the signal ends the process first
		os.Exit(128 + int(s))
	}
	os.Exit(code & 0xff)
}

// lineWriter writes through at once (no buffering).
type lineWriter struct{ w io.Writer }

func (l lineWriter) Write(p []byte) (int, error) { return l.w.Write(p) }

func usage(out io.Writer, argv0 string) {
	fmt.Fprintf(out, "usage: %s\n", argv0)
	fmt.Fprintf(out, "\t-m multicast_address\n")
	fmt.Fprintf(out, "\t[-M unmapped_multicast_address]\n\t replaces -m and requires -b\n")
	fmt.Fprintf(out, "\t[-s(ender)]\n")
	fmt.Fprintf(out, "\t[-b bind_address]\n")
	fmt.Fprintf(out, "\t[-c connections]\n")
	fmt.Fprintf(out, "\t[-C message_count]\n")
	fmt.Fprintf(out, "\t[-S message_size]\n")
	fmt.Fprintf(out, "\t[-p port_space - %#x for UDP (default), %#x for IPOIB]\n", 0x111, 0x2)
	fmt.Fprintf(out, "\t[-o join as a send-only full-member]\n")
	fmt.Fprintf(out, "\t[-l join without multicast loopback]\n")
	fmt.Fprintf(out, "\textensions (not in rdma-core's mckey):\n")
	for _, e := range extensions {
		fmt.Fprintf(out, "\t[--%s]\n\t %s\n", e.usage, e.help)
	}
}

// extensions describes the long options that are not rdma-core's.
var extensions = []struct{ name, usage, help string }{
	{"iface", "iface name", "bind to the first IPv4 (else IPv6) address of interface name, when -b is absent"},
	{"timeout", "timeout duration", "a receiver gives up after duration (e.g. 5s) without a message: status -110; 0 waits forever"},
	{"no-imm", "no-imm", "send SEND without immediate data (rdma-core always sends SEND_WITH_IMM)"},
	{"verify", "verify", "check every completion: status, byte_len = 40 + size, imm = sender QPN, the payload pattern this mckey sends"},
	{"join-pause", "join-pause duration", "pause that long after joining instead of 3s"},
	{"pcap", "pcap file", "write every frame the process's devices send and receive to a pcap file (tshark decodes port 4791)"},
}
