// Command softrdma is softrdma's operator tool. With no arguments it runs
// the demo: three RDMA CM ids on loopback join one multicast group — a
// full-member receiver, a send-only sender and a full-member sender whose
// QP blocks its own multicast loopback — exchange datagrams over real
// RoCEv2 on UDP 4791, and check who received what.
//
// Usage:
//
//	softrdma [demo] [-group 239.x.y.z] [-bind 127.0.0.1] [-count N] [-size N]
//	softrdma help
//
// Each subcommand lives in a file of its own and registers itself in
// commands from an init function.
package main

import (
	// Every kind of device (RoCEv2, InfiniBand, the kernel's with the rdmacore tag).
	_ "github.com/softrdma/softrdma/provider/all"

	"fmt"
	"io"
	"os"
	"sort"
)

// command is one subcommand: run gets the arguments after its name and
// returns the exit status.
type command struct {
	summary string
	run     func(args []string, stdout, stderr io.Writer) int
}

// commands holds the subcommands by name.
var commands = map[string]command{}

func init() {
	commands["demo"] = command{
		summary: "join a group on loopback with three ids and check who receives what (the default)",
		run:     func(args []string, stdout, _ io.Writer) int { return demo(args, stdout) },
	}
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	name := "demo"
	if len(args) > 0 && args[0] != "" && args[0][0] != '-' {
		name, args = args[0], args[1:]
	}
	if name == "help" || len(args) > 0 && name == "demo" && isHelp(args[0]) {
		usage(stdout)
		return 0
	}
	c, ok := commands[name]
	if !ok {
		fmt.Fprintf(stderr, "softrdma: unknown command %q\n", name)
		usage(stderr)
		return 2
	}
	return c.run(args, stdout, stderr)
}

// isHelp reports whether a first argument asks for the usage.
func isHelp(a string) bool { return a == "-h" || a == "-help" || a == "--help" }

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: softrdma [command] [flags]   (softrdma COMMAND -h for its flags)")
	fmt.Fprintln(w, "With no command, softrdma runs the demo. Commands:")
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "  %-10s %s\n", n, commands[n].summary)
	}
}
