package main

// softrdma capture: a pcap capture of what a running process's devices
// send and receive (what tcpdump on an RDMA device would show).

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/softrdma/softrdma/capture"
	"github.com/softrdma/softrdma/introspect"
)

func init() {
	commands["capture"] = command{
		summary: "capture what a running process's devices send and receive into a pcap file (RoCEv2 frames)",
		run:     captureCmd,
	}
}

func captureCmd(args []string, stdout, stderr io.Writer) int {
	t := target{stderr: stderr}
	fs := newFlagSet("capture", "[-p PID | -addr ADDR] -w FILE [-i DEVICE] [-dir both|sent|received] [-c COUNT] [-d DURATION] [-s SNAPLEN]",
		"Turns on packet capture in a running process and writes the frames it sends and\nreceives (Ethernet/IP/UDP/RoCEv2 with the real ICRC) to a pcap file, until COUNT\nframes, DURATION, Ctrl-C or the exit of the process (\"process N exited\", status 0). Read it with tshark or Wireshark: port 4791 decodes as RoCE.", stderr)
	fs.IntVar(&t.pid, "p", 0, "`PID` of the process (its endpoint: SOFTRDMA_DEBUG_ADDR=unix)")
	fs.StringVar(&t.addr, "addr", "", "endpoint `address`: unix:PATH or 127.0.0.1:PORT (instead of -p)")
	file := fs.String("w", "", "write the pcap to `FILE` (- for standard output)")
	dev := fs.String("i", "", "capture on `DEVICE` only (default: every device, also ones created later)")
	dir := fs.String("dir", "both", "`direction`: both, sent or received")
	count := fs.Int("c", 0, "stop after `COUNT` frames (0: no limit)")
	dur := fs.Duration("d", 0, "stop after `DURATION` (0: no limit)")
	snap := fs.Int("s", 0, "keep at most `SNAPLEN` bytes of each frame (0: all)")
	if !parseArgs(fs, args, stderr) {
		return 2
	}
	d, err := capture.ParseDirection(*dir)
	if *file == "" || err != nil || *count < 0 || *dur < 0 || *snap < 0 {
		if err != nil {
			fmt.Fprintf(stderr, "softrdma capture: %v\n", err)
		} else {
			fmt.Fprintln(stderr, "softrdma capture: -w FILE is required; -c, -d and -s must not be negative")
		}
		fs.Usage()
		return 2
	}
	c, err := t.client()
	if err != nil {
		fmt.Fprintf(stderr, "softrdma capture: %v\n", err)
		return 1
	}
	defer c.Close()
	// The target's PID, to tell its exit from a broken endpoint.
	pid := t.pid
	if pid == 0 {
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		s, err := c.Snapshot(sctx)
		cancel()
		if err != nil {
			fmt.Fprintf(stderr, "softrdma capture: %v\n", err)
			return 1
		}
		pid = s.PID
	}

	var out io.Writer = stdout
	var f *os.File
	if *file != "-" {
		if f, err = os.Create(*file); err != nil {
			fmt.Fprintf(stderr, "softrdma capture: %v\n", err)
			return 1
		}
		out = f
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	pc := &pcapCounter{w: out}
	where := "every device"
	if *dev != "" {
		where = *dev
	}
	what := map[capture.Direction]string{capture.Both: "sent and received", capture.Sent: "sent", capture.Received: "received"}[d]
	req := introspect.CaptureRequest{Device: *dev, Direction: d, Count: *count, Duration: *dur, Snaplen: *snap}
	start := time.Now()
	_, err = c.Capture(ctx, req, pc, func() {
		fmt.Fprintf(stderr, "softrdma capture: capturing frames %s on %s through %s into %s (Ctrl-C stops)\n", what, where, c.Target(), *file)
	})
	if f != nil {
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	// The endpoint ends a capture cleanly when its process exits; a capture
	// that ends before its count and duration, not by Ctrl-C, lost its
	// process or its connection.
	early := ctx.Err() == nil && (*count == 0 || pc.frames < *count) && (*dur == 0 || time.Since(start) < *dur)
	if early && processExited(pid) {
		fmt.Fprintf(stderr, "softrdma capture: process %d exited\n", pid)
		err = nil
	}
	if err != nil {
		fmt.Fprintf(stderr, "softrdma capture: %v\n", err)
		return 1
	}
	fmt.Fprintf(stderr, "softrdma capture: %d frames (%d bytes) in %.1fs\n", pc.frames, pc.bytes, time.Since(start).Seconds())
	return 0
}

// pcapCounter passes a classic pcap stream through and counts its frames.
type pcapCounter struct {
	w      io.Writer
	bytes  int64
	frames int
	hdr    []byte // the part of a header seen so far
	skip   int    // bytes of the current frame's data still to come
	global bool   // the 24-byte file header was seen
}

func (p *pcapCounter) Write(b []byte) (int, error) {
	n, err := p.w.Write(b)
	p.bytes += int64(n)
	rest := b[:n]
	for len(rest) > 0 {
		if p.skip > 0 {
			k := min(p.skip, len(rest))
			p.skip -= k
			rest = rest[k:]
			continue
		}
		need := 16
		if !p.global {
			need = 24
		}
		k := min(need-len(p.hdr), len(rest))
		p.hdr = append(p.hdr, rest[:k]...)
		rest = rest[k:]
		if len(p.hdr) < need {
			break
		}
		if !p.global {
			p.global = true
		} else {
			p.frames++
			p.skip = int(binary.LittleEndian.Uint32(p.hdr[8:12]))
		}
		p.hdr = p.hdr[:0]
	}
	return n, err
}
