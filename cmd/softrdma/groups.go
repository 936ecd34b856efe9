package main

// softrdma groups: the multicast groups of a running process (what
// saquery -g and `ip maddr` tell on a real host), with the CM joins.

import (
	"fmt"
	"io"
	"strings"

	"github.com/softrdma/softrdma/introspect"
)

func init() {
	commands["groups"] = command{
		summary: "show the multicast groups of a running process: MGID, address, membership, attached QPs, joins",
		run:     groupsCmd,
	}
}

func groupsCmd(args []string, stdout, stderr io.Writer) int {
	t := target{stderr: stderr}
	fs := newFlagSet("groups", "[-p PID | -addr ADDR] [-d DEVICE] [--json]",
		"Shows, per device and group: the MGID and IP address, whether the device holds the\nIP membership (IGMP/MLD) and how many CM references it has, the attached QPs in\ndelivery order, and every RDMA CM join: id, join flags, state, QP, attached.", stderr)
	t.flags(fs)
	dev := fs.String("d", "", "show only the groups of `DEVICE`")
	if !parseArgs(fs, args, stderr) {
		return 2
	}
	s, c, err := t.snapshot()
	if err != nil {
		fmt.Fprintf(stderr, "softrdma groups: %v\n", err)
		return 1
	}
	defer c.Close()
	gs := []introspect.Group{}
	for _, g := range s.Groups {
		if *dev == "" || g.Device == *dev {
			gs = append(gs, g)
		}
	}
	if t.json {
		printJSON(stdout, struct {
			PID     int                `json:"pid"`
			Command string             `json:"command"`
			Groups  []introspect.Group `json:"groups"`
		}{s.PID, s.Command, gs})
		return 0
	}
	fmt.Fprintf(stdout, "process %d (%s), endpoint %s\n", s.PID, s.Command, c.Target())
	if len(gs) == 0 {
		fmt.Fprintln(stdout, "no multicast groups")
		return 0
	}
	for _, g := range gs {
		printGroup(stdout, g)
	}
	return 0
}

func printGroup(w io.Writer, g introspect.Group) {
	name := g.Addr
	if name == "" {
		name = g.MGID
	}
	fmt.Fprintf(w, "\n%s %s  mgid %s\n", g.Device, name, g.MGID)
	if g.MLID != 0 || g.SAJoinState != 0 {
		fmt.Fprintf(w, "\tsa membership:  mlid %#x, join state %#x\n", g.MLID, g.SAJoinState)
	} else {
		mship := "not joined"
		if g.IPMembership {
			mship = "joined on the interface (IGMP/MLD)"
		}
		fmt.Fprintf(w, "\tip membership:  %s, %d CM reference(s)\n", mship, g.CMRefs)
	}
	qps := "none"
	if len(g.AttachedQPs) > 0 {
		var s []string
		for _, q := range g.AttachedQPs {
			s = append(s, fmt.Sprintf("%#06x", q))
		}
		qps = strings.Join(s, " ")
	}
	fmt.Fprintf(w, "\tattached QPs:   %s\n", qps)
	if len(g.Joins) == 0 {
		fmt.Fprintf(w, "\tjoins:          none (attached through verbs)\n")
		return
	}
	fmt.Fprintf(w, "\tjoins:          %d\n", len(g.Joins))
	for _, j := range g.Joins {
		qp := "no QP"
		if j.QPN != 0 {
			qp = fmt.Sprintf("qp %#06x", j.QPN)
			switch {
			case j.Attached:
				qp += " attached"
			case j.JoinType == "send-only":
				qp += " not attached (send-only)"
			case j.State == "pending":
				qp += " not attached yet"
			default:
				qp += " NOT attached"
			}
		}
		var extra []string
		if j.EventsQueued > 0 {
			extra = append(extra, fmt.Sprintf("%d event(s) queued", j.EventsQueued))
		}
		if j.EventsUnacked > 0 {
			extra = append(extra, fmt.Sprintf("%d event(s) unacked", j.EventsUnacked))
		}
		line := fmt.Sprintf("\t  cm_id %-3d %-22s %-9s (flags %d)  %-7s  %s", j.CMID, j.Src, j.JoinType, j.JoinFlags, j.State, qp)
		if len(extra) > 0 {
			line += "  [" + strings.Join(extra, ", ") + "]"
		}
		fmt.Fprintln(w, line)
	}
}
