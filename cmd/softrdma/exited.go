package main

// When a watched process goes away, its endpoint closes a moment before
// the process is gone; the tools then say that it exited instead of
// printing the broken connection.

import (
	"bytes"
	"fmt"
	"os"
	"time"
)

// exitWait is how long a tool waits, after the endpoint failed, for the
// target process to be gone.
const exitWait = 2 * time.Second

// processExited reports whether process pid is gone (or a zombie) within
// exitWait.
func processExited(pid int) bool {
	if pid <= 0 {
		return false
	}
	deadline := time.Now().Add(exitWait)
	for {
		if !processAlive(pid) {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// processAlive reports whether pid is a running process: /proc/PID/stat
// exists and its state is not Z (zombie) or X (dead).
func processAlive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	i := bytes.LastIndexByte(b, ')') // the command name may hold spaces and parentheses
	if i < 0 || i+2 >= len(b) {
		return true
	}
	return b[i+2] != 'Z' && b[i+2] != 'X'
}
