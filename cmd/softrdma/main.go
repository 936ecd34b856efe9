// Command softrdma is softrdma's operator tool. With no arguments it runs
// the demo: three RDMA CM ids on loopback join one multicast group — a
// full-member receiver, a send-only sender and a full-member sender whose
// QP blocks its own multicast loopback — exchange datagrams over real
// RoCEv2 on UDP 4791, and check who received what.
//
// Usage:
//
//	softrdma [demo] [-group 239.x.y.z] [-bind 127.0.0.1] [-count N] [-size N]
package main

import (
	"fmt"
	"os"
)

func main() {
	args := os.Args[1:]
	cmd := "demo"
	if len(args) > 0 && args[0] != "" && args[0][0] != '-' {
		cmd, args = args[0], args[1:]
	}
	switch cmd {
	case "demo":
		os.Exit(demo(args, os.Stdout))
	case "help", "-h", "--help":
		fmt.Println("usage: softrdma [demo] [flags]   (softrdma demo -h for the flags)")
	default:
		fmt.Fprintf(os.Stderr, "softrdma: unknown command %q\n", cmd)
		os.Exit(2)
	}
}
