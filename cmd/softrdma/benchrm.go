package main

import (
	"fmt"
	"io"
	"os"

	"github.com/softrdma/softrdma/cmd/softrdma/internal/bench"
)

// rmCommand is the hidden subcommand of the reliable part's "softrdma"
// peer (package mcast): bench runs this binary with it in the hosts'
// namespaces.
const rmCommand = "bench-mcast"

func init() {
	if exe, err := os.Executable(); err == nil {
		bench.RegisterReliablePeer(bench.McastPeer(exe, rmCommand))
	}
	if len(os.Args) > 1 && os.Args[1] == rmCommand {
		commands[rmCommand] = command{run: func(args []string, stdout, stderr io.Writer) int {
			if err := bench.RunMcastPeer(args, os.Stdin, stdout); err != nil {
				fmt.Fprintln(stderr, "softrdma peer:", err)
				return 1
			}
			return 0
		}}
	}
}
