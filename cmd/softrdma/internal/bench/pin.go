package bench

import (
	"fmt"
	"os/exec"
	"runtime"

	"golang.org/x/sys/unix"
)

// The latency part's two processes stand for two hosts. On one machine
// the scheduler sometimes runs both on one core, where waking the other
// side is a context switch without an inter-processor interrupt — which
// two hosts never have — and sometimes on two: the UDP baseline's
// blocking round trip flips between about 19 and 26 µs with it on the
// 2-core VM, minute to minute (2026-12-06). So each process gets a core
// of its own (Config.LatPin), the baseline's and softrdma's alike.

// latCPUs picks the pinger's and the ponger's CPUs: the first two this
// process may run on; ok false when it may run on fewer than two.
func latCPUs() (ping, pong int, ok bool) {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		return 0, 0, false
	}
	var cpus []int
	for c := 0; c < len(set)*64 && len(cpus) < 2; c++ {
		if set.IsSet(c) {
			cpus = append(cpus, c)
		}
	}
	if len(cpus) < 2 {
		return 0, 0, false
	}
	return cpus[0], cpus[1], true
}

// startOn starts cmd with its CPU affinity set to cpu alone (cpu < 0:
// inherited): the child is cloned from this thread, whose mask it takes,
// so every thread it ever makes runs on cpu.
func startOn(cmd *exec.Cmd, cpu int) error {
	if cpu < 0 {
		return cmd.Start()
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var old, set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &old); err != nil {
		return fmt.Errorf("sched_getaffinity: %w", err)
	}
	set.Set(cpu)
	if err := unix.SchedSetaffinity(0, &set); err != nil {
		return fmt.Errorf("pin to CPU %d: %w", cpu, err)
	}
	err := cmd.Start()
	if rerr := unix.SchedSetaffinity(0, &old); rerr != nil && err == nil {
		err = fmt.Errorf("restore the CPU mask: %w", rerr)
	}
	return err
}
