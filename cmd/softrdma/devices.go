package main

// softrdma devices: the devices of a running process, like ibv_devinfo.
// This file also holds what the endpoint-reading subcommands share: how a
// user points at a process (-p PID, -addr ADDR) and the --json switch.

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/bits"
	"os"
	"strings"
	"time"

	"github.com/softrdma/softrdma/introspect"
	"github.com/softrdma/softrdma/verbs"
)

func init() {
	commands["devices"] = command{
		summary: "show the devices, ports, GIDs, limits and QPs of a running process (like ibv_devinfo)",
		run:     devicesCmd,
	}
}

// target is how a subcommand finds the process to read.
type target struct {
	pid    int
	addr   string
	json   bool
	stderr io.Writer // where the process picked without -p or -addr is named
}

func (t *target) flags(fs *flag.FlagSet) {
	fs.IntVar(&t.pid, "p", 0, "`PID` of the process (its endpoint: SOFTRDMA_DEBUG_ADDR=unix)")
	fs.StringVar(&t.addr, "addr", "", "endpoint `address`: unix:PATH or 127.0.0.1:PORT (instead of -p)")
	fs.BoolVar(&t.json, "json", false, "print JSON")
}

// newFlagSet returns a flag set whose usage names the command and syntax.
func newFlagSet(name, syntax, about string, out io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(out)
	fs.Usage = func() {
		fmt.Fprintf(out, "usage: softrdma %s %s\n%s\n\nWithout -p or -addr the only process with an endpoint is used.\n\n", name, syntax, about)
		fs.PrintDefaults()
	}
	return fs
}

// parseArgs parses flags and refuses positional arguments.
func parseArgs(fs *flag.FlagSet, args []string, stderr io.Writer) bool {
	if err := fs.Parse(args); err != nil {
		return false
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "softrdma %s: unexpected argument %q\n", fs.Name(), fs.Arg(0))
		fs.Usage()
		return false
	}
	return true
}

// client returns a client of the process the flags name.
func (t *target) client() (*introspect.Client, error) {
	switch {
	case t.addr != "" && t.pid != 0:
		return nil, errors.New("give -p or -addr, not both")
	case t.addr != "":
		return introspect.Dial(t.addr)
	case t.pid != 0:
		return introspect.ForPID(t.pid)
	}
	eps := introspect.Endpoints()
	switch len(eps) {
	case 0:
		return nil, fmt.Errorf("no process with an endpoint found; start one with %s=unix, or give -addr", introspect.EnvAddr)
	case 1:
		if t.stderr != nil {
			fmt.Fprintf(t.stderr, "softrdma: process %d%s, the only one with an endpoint (-p to choose)\n", eps[0].PID, commandOf(eps[0].PID))
		}
		return introspect.ForPID(eps[0].PID)
	}
	var pids []string
	for _, e := range eps {
		pids = append(pids, fmt.Sprint(e.PID))
	}
	return nil, fmt.Errorf("several processes have an endpoint (%s): choose one with -p", strings.Join(pids, ", "))
}

// commandOf is " (NAME)" with process pid's command name, or "" when it
// cannot be read.
func commandOf(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
	if err != nil {
		return ""
	}
	return " (" + strings.TrimSpace(string(b)) + ")"
}

// snapshot reads the snapshot of the target process.
func (t *target) snapshot() (*introspect.Snapshot, *introspect.Client, error) {
	c, err := t.client()
	if err != nil {
		return nil, nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := c.Snapshot(ctx)
	if err != nil {
		c.Close()
		return nil, nil, err
	}
	return s, c, nil
}

func printJSON(w io.Writer, v any) {
	b, _ := json.MarshalIndent(v, "", "  ")
	w.Write(append(b, '\n'))
}

// mtuEnum is the ibv_mtu value of an MTU in bytes (0 when none).
func mtuEnum(b int) int {
	if b < 256 || b&(b-1) != 0 {
		return 0
	}
	return bits.TrailingZeros(uint(b)) - 7
}

func devicesCmd(args []string, stdout, stderr io.Writer) int {
	t := target{stderr: stderr}
	fs := newFlagSet("devices", "[-p PID | -addr ADDR] [-d DEVICE] [-v] [--json]",
		"Shows the software RoCEv2 devices of a running process like ibv_devinfo: attributes,\nport 1 (state, MTU, GID table), multicast limits and the QPs (state, Q_Key, groups).", stderr)
	t.flags(fs)
	dev := fs.String("d", "", "show only `DEVICE` (e.g. rxe_lo)")
	verbose := fs.Bool("v", false, "show every device limit and what the device uses")
	if !parseArgs(fs, args, stderr) {
		return 2
	}
	s, c, err := t.snapshot()
	if err != nil {
		fmt.Fprintf(stderr, "softrdma devices: %v\n", err)
		return 1
	}
	defer c.Close()
	devs := s.Devices
	if *dev != "" {
		devs = nil
		for _, d := range s.Devices {
			if d.Name == *dev {
				devs = append(devs, d)
			}
		}
		if len(devs) == 0 {
			fmt.Fprintf(stderr, "softrdma devices: process %d has no device %q\n", s.PID, *dev)
			return 1
		}
	}
	if t.json {
		printJSON(stdout, struct {
			PID     int                 `json:"pid"`
			Command string              `json:"command"`
			Devices []introspect.Device `json:"devices"`
		}{s.PID, s.Command, devs})
		return 0
	}
	fmt.Fprintf(stdout, "process %d (%s), endpoint %s\n", s.PID, s.Command, c.Target())
	if len(devs) == 0 {
		fmt.Fprintln(stdout, "No IB devices found")
		return 0
	}
	for _, d := range devs {
		printDevice(stdout, d, *verbose)
	}
	return 0
}

// linkLayer is the link layer of the device's first port, which decides
// what it shows (SA memberships on InfiniBand, sockets and UDP source
// ports on RoCE), whatever kind of device it is.
func linkLayer(d introspect.Device) string {
	if len(d.Ports) == 0 {
		return ""
	}
	return d.Ports[0].LinkLayer
}

func printDevice(w io.Writer, d introspect.Device, verbose bool) {
	// Values line up at column 40 with 8-column tabs.
	kv := func(indent, k string, v any) {
		fmt.Fprintf(w, "%s%-*s %v\n", indent, 39-8*len(indent), k+":", v)
	}
	fmt.Fprintf(w, "hca_id:\t%s\n", d.Name)
	kv("\t", "transport", "InfiniBand (0)")
	kv("\t", "fw_ver", d.FWVer)
	kv("\t", "node_guid", d.NodeGUID)
	kv("\t", "sys_image_guid", d.SysImageGUID)
	kv("\t", "vendor_id", fmt.Sprintf("%#04x", d.VendorID))
	kv("\t", "vendor_part_id", d.VendorPartID)
	kv("\t", "hw_ver", fmt.Sprintf("%#x", d.HWVer))
	kv("\t", "phys_port_cnt", d.PhysPortCnt)
	if d.Ifname != "" {
		kv("\t", "netdev", fmt.Sprintf("%s (ifindex %d, %s)", d.Ifname, d.Ifindex, d.MAC))
	}
	l := d.Limits
	if verbose {
		kv("\t", "max_qp", l.MaxQP)
		kv("\t", "max_qp_wr", l.MaxQPWR)
		kv("\t", "max_sge", l.MaxSGE)
		kv("\t", "max_cq", l.MaxCQ)
		kv("\t", "max_cqe", l.MaxCQE)
		kv("\t", "max_mr", l.MaxMR)
		kv("\t", "max_pd", l.MaxPD)
		kv("\t", "max_ah", l.MaxAH)
		kv("\t", "max_inline_data", l.MaxInlineData)
	}
	kv("\t", "max_mcast_grp", l.MaxMcastGrp)
	kv("\t", "max_mcast_qp_attach", l.MaxMcastQPAttach)
	kv("\t", "max_total_mcast_qp_attach", l.MaxTotalMcastQPAttach)
	if verbose {
		u := d.Usage
		if linkLayer(d) == verbs.LinkLayerInfiniBand.String() {
			kv("\t", "in_use", fmt.Sprintf("%d QPs, %d mcast groups, %d attachments, %d SA memberships",
				u.QPs, u.McastGroups, u.McastAttachments, u.SAMemberships))
		} else {
			kv("\t", "in_use", fmt.Sprintf("%d QPs, %d mcast groups, %d attachments, %d IP memberships, %d recv / %d send sockets",
				u.QPs, u.McastGroups, u.McastAttachments, u.IPMemberships, u.RecvSockets, u.SendSockets))
		}
	}
	for _, p := range d.Ports {
		fmt.Fprintf(w, "\t\tport:\t%d\n", p.Port)
		kv("\t\t\t", "state", fmt.Sprintf("%s (%d)", p.State, p.StateNum))
		kv("\t\t\t", "max_mtu", fmt.Sprintf("%d (%d)", p.MaxMTU, mtuEnum(p.MaxMTU)))
		kv("\t\t\t", "active_mtu", fmt.Sprintf("%d (%d)", p.ActiveMTU, mtuEnum(p.ActiveMTU)))
		kv("\t\t\t", "netdev_mtu", p.NetdevMTU)
		kv("\t\t\t", "sm_lid", p.SMLID)
		kv("\t\t\t", "port_lid", p.LID)
		kv("\t\t\t", "port_lmc", fmt.Sprintf("%#02x", p.LMC))
		kv("\t\t\t", "link_layer", p.LinkLayer)
		if verbose {
			kv("\t\t\t", "gid_tbl_len", p.GIDTableLen)
			kv("\t\t\t", "pkey_tbl_len", p.PKeyTableLen)
		}
		for _, g := range p.GIDs {
			kv("\t\t\t", fmt.Sprintf("GID[%3d]", g.Index), fmt.Sprintf("%s, %s", g.GID, g.Type))
		}
	}
	if len(d.QPs) == 0 {
		kv("\t", "qps", "none")
	} else {
		kv("\t", "qps", len(d.QPs))
	}
	for _, q := range d.QPs {
		var extra []string
		if q.CMID != 0 {
			extra = append(extra, fmt.Sprintf("cm_id %d", q.CMID))
		}
		if q.BlockSelfMcastLB {
			extra = append(extra, "block_self_mcast_lb")
		}
		groups := "none"
		if len(q.Groups) > 0 {
			groups = strings.Join(q.Groups, ",")
		}
		sport := ""
		if linkLayer(d) == verbs.LinkLayerEthernet.String() && q.SrcPort != 0 {
			sport = fmt.Sprintf("  udp_sport %d", q.SrcPort)
		}
		fmt.Fprintf(w, "\t\tqpn %#06x  %s %-5s qkey %#08x  port %d%s  groups %s", q.QPN, q.Type, q.State, q.QKey, q.Port, sport, groups)
		if len(extra) > 0 {
			fmt.Fprintf(w, "  (%s)", strings.Join(extra, ", "))
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintln(w)
}

// printJSONLine prints v as one line of JSON (for streams of samples).
func printJSONLine(w io.Writer, v any) {
	b, _ := json.Marshal(v)
	w.Write(append(b, '\n'))
}
