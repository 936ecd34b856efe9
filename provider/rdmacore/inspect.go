//go:build rdmacore && cgo

package rdmacore

// #include "shim.h"
import "C"

import (
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/softrdma/softrdma/verbs"
	"github.com/softrdma/softrdma/verbs/driver"
)

// Kernel devices in the operator tools (softrdma devices, stat, --json,
// Prometheus): a kernel device offers driver.Inspector (its port, GID table
// and network interface, as ibv_devinfo shows them) and driver.CounterSource
// (the kernel's counters of each port, read from sysfs when asked:
// ports/N/hw_counters/* — rxe's sent_pkts, rcvd_pkts, send_err … — and
// ports/N/counters/*, the IB port counters). A counter that means what a
// softrdma device's counter means takes its name and metric (rxe's
// sent_pkts and rcvd_pkts, send_err as send_errors); the others keep the
// kernel's name, with a port prefix beyond port 1, and feed the metric
// softrdma_kernel_<name>.

// sysfsRoot is where the kernel lists its RDMA devices.
const sysfsRoot = "/sys/class/infiniband"

// sameMeaning maps a kernel counter's name to the counter every backend
// has that counts the same thing.
var sameMeaning = map[string]verbs.CounterDesc{
	"sent_pkts": driver.CounterSentPkts,
	"rcvd_pkts": driver.CounterRcvdPkts,
	"send_err":  driver.CounterSendErrors,
}

// counters is a kernel device's counter schema and the sysfs files of its
// values, found on first use.
type counters struct {
	once   sync.Once
	schema []verbs.CounterDesc
	files  []string
}

// load lists the device's counter files.
func (c *counters) load(dev string) {
	c.once.Do(func() {
		ports, _ := filepath.Glob(filepath.Join(sysfsRoot, dev, "ports", "*"))
		slices.SortFunc(ports, func(a, b string) int { return atoi(filepath.Base(a)) - atoi(filepath.Base(b)) })
		for _, p := range ports {
			port := filepath.Base(p)
			for _, dir := range []string{"hw_counters", "counters"} {
				names, _ := filepath.Glob(filepath.Join(p, dir, "*"))
				slices.Sort(names)
				for _, f := range names {
					if st, err := os.Stat(f); err != nil || !st.Mode().IsRegular() {
						continue
					}
					name := filepath.Base(f)
					if name == "lifespan" {
						continue // a setting, not a count
					}
					d := verbs.CounterDesc{
						Name:   name,
						Help:   "The kernel's counter " + strings.TrimPrefix(f, sysfsRoot+"/") + ".",
						Metric: "kernel_" + name,
					}
					if s, ok := sameMeaning[name]; ok {
						d.Name, d.Metric, d.Reason = s.Name, s.Metric, s.Reason
					}
					if port != "1" {
						d.Name, d.Metric = "p"+port+"_"+d.Name, "kernel_p"+port+"_"+name
					}
					c.schema = append(c.schema, d)
					c.files = append(c.files, f)
				}
			}
		}
	})
}

// CounterSchema returns the device's counters (driver.CounterSource).
func (d *device) CounterSchema() []verbs.CounterDesc {
	d.ctrs.load(d.name)
	return d.ctrs.schema
}

// DeviceCounters reads the device's counters from sysfs; a counter that
// cannot be read is 0.
func (d *device) DeviceCounters() []uint64 {
	d.ctrs.load(d.name)
	out := make([]uint64, len(d.ctrs.files))
	for i, f := range d.ctrs.files {
		if b, err := os.ReadFile(f); err == nil {
			out[i], _ = strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
		}
	}
	return out
}

// QPCounters: the kernel keeps no counters per QP that sysfs shows.
func (d *device) QPCounters(uint32) ([]uint64, bool) { return nil, false }

// Inspect returns the device as ibv_devinfo shows it: port 1's attributes,
// the GID tables and the network interface of a RoCE port
// (driver.Inspector).
func (d *device) Inspect() verbs.DeviceReport {
	r := verbs.DeviceReport{Kind: "kernel"}
	a, err := d.queryAttr()
	if err != nil {
		return r
	}
	k := &kctx{dev: d, c: d.qctx} // the query context, open for the process
	if pa, err := k.QueryPort(1); err == nil {
		r.Port = pa
	}
	if g, err := d.allGIDs(); err == nil {
		r.GIDs = g
	}
	if a.PhysPortCnt > 0 {
		if b, err := os.ReadFile(filepath.Join(sysfsRoot, d.name, "ports", "1", "gid_attrs", "ndevs", "0")); err == nil {
			if ifi, err := net.InterfaceByName(strings.TrimSpace(string(b))); err == nil {
				r.Netdev = verbs.NetdevReport{Name: ifi.Name, Index: ifi.Index, MAC: ifi.HardwareAddr.String()}
			}
		}
	}
	return r
}
