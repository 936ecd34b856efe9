package main

// softrdma stat: the device and QP counters of a running process (what
// `rdma stat` shows for a kernel device), once or watched (-w).

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"time"

	"github.com/softrdma/softrdma/introspect"
)

func init() {
	commands["stat"] = command{
		summary: "show the device and QP counters of a running process; -w watches the deltas",
		run:     statCmd,
	}
}

// counterSet is the counters of one device or QP.
type counterSet struct {
	key      string // "rxe_lo" or "rxe_lo/0x9c4d01"
	label    string
	names    []string
	counters introspect.Counters
}

// counterSets flattens a snapshot into device and QP counter sets.
func counterSets(s *introspect.Snapshot, dev string, qps bool) []counterSet {
	var out []counterSet
	for _, d := range s.Devices {
		if dev != "" && d.Name != dev {
			continue
		}
		out = append(out, counterSet{key: d.Name, label: "device " + d.Name, names: d.CounterNames(), counters: d.Counters})
		if !qps {
			continue
		}
		for _, q := range d.QPs {
			label := fmt.Sprintf("qp %s/%#06x", d.Name, q.QPN)
			if q.CMID != 0 {
				label += fmt.Sprintf(" (cm_id %d)", q.CMID)
			}
			out = append(out, counterSet{key: fmt.Sprintf("%s/%#06x", d.Name, q.QPN), label: label, names: d.QPCounterNames(), counters: q.Counters})
		}
	}
	return out
}

// statSample is one -w interval in JSON.
type statSample struct {
	PID      int                            `json:"pid"`
	Time     time.Time                      `json:"time"`
	Interval float64                        `json:"interval_seconds"`
	Deltas   map[string]introspect.Counters `json:"deltas"`
	Totals   map[string]introspect.Counters `json:"totals"`
}

func statCmd(args []string, stdout, stderr io.Writer) int {
	t := target{stderr: stderr}
	fs := newFlagSet("stat", "[-p PID | -addr ADDR] [-d DEVICE] [-qp=false] [-a] [-w INTERVAL [-n COUNT]] [--json]",
		"Shows every counter of the devices and their QPs. With -w it prints, every interval,\nthe counters that changed: the increase, the rate per second and the total, until\nCOUNT intervals, Ctrl-C, or the process exits (\"process N exited\", status 0).", stderr)
	t.flags(fs)
	dev := fs.String("d", "", "show only `DEVICE`")
	qps := fs.Bool("qp", true, "show the counters of each QP too")
	all := fs.Bool("a", false, "show counters that are zero too")
	watch := fs.Duration("w", 0, "watch: print the deltas every `INTERVAL` (e.g. 1s) until interrupted")
	count := fs.Int("n", 0, "with -w, stop after `COUNT` intervals (0: until interrupted)")
	if !parseArgs(fs, args, stderr) {
		return 2
	}
	if *watch < 0 || *count < 0 || (*watch > 0 && *watch < 10*time.Millisecond) {
		fmt.Fprintln(stderr, "softrdma stat: -w must be at least 10ms and -n at least 0")
		return 2
	}
	c, err := t.client()
	if err != nil {
		fmt.Fprintf(stderr, "softrdma stat: %v\n", err)
		return 1
	}
	defer c.Close()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	fetch := func() (*introspect.Snapshot, error) {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		return c.Snapshot(cctx)
	}
	s, err := fetch()
	if err != nil {
		fmt.Fprintf(stderr, "softrdma stat: %v\n", err)
		return 1
	}
	if *dev != "" && len(counterSets(s, *dev, false)) == 0 {
		fmt.Fprintf(stderr, "softrdma stat: process %d has no device %q\n", s.PID, *dev)
		return 1
	}
	if *watch == 0 {
		sets := counterSets(s, *dev, *qps)
		if t.json {
			totals := map[string]introspect.Counters{}
			for _, cs := range sets {
				totals[cs.key] = cs.counters
			}
			printJSON(stdout, struct {
				PID    int                            `json:"pid"`
				Time   time.Time                      `json:"time"`
				Totals map[string]introspect.Counters `json:"totals"`
				CM     introspect.CMStats             `json:"cm"`
			}{s.PID, s.Time, totals, s.CM})
			return 0
		}
		fmt.Fprintf(stdout, "process %d (%s), endpoint %s\n", s.PID, s.Command, c.Target())
		for _, cs := range sets {
			fmt.Fprintf(stdout, "%s\n", cs.label)
			shown := 0
			for _, n := range cs.names {
				if v := cs.counters[n]; v != 0 || *all {
					fmt.Fprintf(stdout, "    %-22s %d\n", n, v)
					shown++
				}
			}
			if shown == 0 {
				fmt.Fprintf(stdout, "    (all zero)\n")
			}
		}
		cm := s.CM
		fmt.Fprintf(stdout, "cm\n    %-22s %d\n    %-22s %d\n    %-22s %d\n    %-22s %d\n    %-22s %d\n    %-22s %d\n    %-22s %d\n",
			"ids", cm.IDs, "event_queue_depth", cm.EventQueueDepth, "events_unacked", cm.EventsUnacked,
			"joins_total", cm.Joins, "join_errors_total", cm.JoinErrors, "leaves_total", cm.Leaves, "attach_errors_total", cm.AttachErrors)
		return 0
	}

	if !t.json {
		fmt.Fprintf(stdout, "process %d (%s), endpoint %s: changes every %v\n", s.PID, s.Command, c.Target(), *watch)
	}
	prev := map[string]introspect.Counters{}
	for _, cs := range counterSets(s, *dev, *qps) {
		prev[cs.key] = cs.counters
	}
	prevTime := s.Time
	tick := time.NewTicker(*watch)
	defer tick.Stop()
	for i := 0; *count == 0 || i < *count; i++ {
		select {
		case <-ctx.Done():
			return 0
		case <-tick.C:
		}
		pid := s.PID
		s, err := fetch()
		if err != nil {
			if ctx.Err() != nil {
				return 0
			}
			if processExited(pid) {
				fmt.Fprintf(stderr, "softrdma stat: process %d exited\n", pid)
				return 0
			}
			fmt.Fprintf(stderr, "softrdma stat: %v\n", err)
			return 1
		}
		secs := s.Time.Sub(prevTime).Seconds()
		if secs <= 0 {
			secs = watch.Seconds()
		}
		sample := statSample{PID: s.PID, Time: s.Time, Interval: secs, Deltas: map[string]introspect.Counters{}, Totals: map[string]introspect.Counters{}}
		var lines []string
		for _, cs := range counterSets(s, *dev, *qps) {
			old, seen := prev[cs.key]
			d := introspect.Counters{}
			for _, n := range cs.names {
				v := cs.counters[n]
				base := uint64(0)
				if seen {
					base = old[n]
				}
				if v < base { // a new object under an old name
					base = 0
				}
				if delta := v - base; delta != 0 || *all {
					d[n] = delta
					lines = append(lines, fmt.Sprintf("  %-28s %-22s %+10d %12.1f/s %14d", cs.key, n, delta, float64(delta)/secs, v))
				}
			}
			sample.Deltas[cs.key] = d
			sample.Totals[cs.key] = cs.counters
			prev[cs.key] = cs.counters
		}
		prevTime = s.Time
		if t.json {
			printJSONLine(stdout, sample)
			continue
		}
		fmt.Fprintf(stdout, "%s  (+%.3fs)\n", s.Time.Local().Format("15:04:05.000"), secs)
		if len(lines) == 0 {
			fmt.Fprintln(stdout, "  no change")
		}
		for _, l := range lines {
			fmt.Fprintln(stdout, l)
		}
	}
	return 0
}
