package verbs_test

import (
	"slices"
	"sync"
	"testing"

	"github.com/softrdma/softrdma/verbs"
	"github.com/softrdma/softrdma/verbs/driver"
)

// recClient records what the host tells it of the devices of host (the
// test's: it hears of every host's, other tests' fakes among them) and
// reports a usage count.
type recClient struct {
	mu   sync.Mutex
	host *verbs.Host
	log  []string
}

type recKey struct{}

// watch makes the client record the devices of h only.
func (c *recClient) watch(h *verbs.Host) {
	c.mu.Lock()
	c.host = h
	c.mu.Unlock()
}

func (c *recClient) mine(d *verbs.Device) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return d.Host() == c.host
}

func (c *recClient) Add(d *verbs.Device) {
	if !c.mine(d) {
		return
	}
	c.mu.Lock()
	c.log = append(c.log, "add "+d.Name())
	c.mu.Unlock()
	d.SetClientData(recKey{}, "state of "+d.Name())
}

func (c *recClient) Remove(d *verbs.Device) {
	if !c.mine(d) {
		return
	}
	c.mu.Lock()
	c.log = append(c.log, "remove "+d.Name())
	c.mu.Unlock()
	d.SetClientData(recKey{}, nil)
}

func (c *recClient) InspectDevice(d *verbs.Device, r *verbs.DeviceReport) {
	if s, ok := d.ClientData(recKey{}).(string); ok {
		r.Usage = append(r.Usage, verbs.UsageCount{Name: s, Value: 1})
	}
}

func (c *recClient) events() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.log)
}

// inspectOps is a backend with a name and a report of its own.
type inspectOps struct {
	driver.DeviceOps
	name string
}

func (o inspectOps) Name() string { return o.name }
func (o inspectOps) Inspect() verbs.DeviceReport {
	return verbs.DeviceReport{Kind: "fake", Usage: []verbs.UsageCount{{Name: "own", Value: 2}}}
}

// rec is registered before any device exists, as RegisterClient asks.
var rec = &recClient{}

func init() { verbs.RegisterClient("test-recorder", rec) }

// TestClients: a registered client hears of every device a host
// registers (before RegisterDevice returns) and of its removal (once,
// even when unregistered twice), keeps its state in the device's client
// data, and adds to the device's report after the backend's own.
func TestClients(t *testing.T) {
	h := verbs.NewHost()
	defer h.Close()
	rec.watch(h)
	defer rec.watch(nil)
	before := len(rec.events())
	d := h.RegisterDevice(inspectOps{name: "fake_client0"})
	if got := rec.events()[before:]; !slices.Equal(got, []string{"add fake_client0"}) {
		t.Fatalf("after RegisterDevice: %q", got)
	}
	if v := d.ClientData(recKey{}); v != "state of fake_client0" {
		t.Fatalf("client data %v", v)
	}
	r, ok := d.Inspect()
	if !ok || r.Kind != "fake" || !slices.Equal(r.Usage, []verbs.UsageCount{{Name: "own", Value: 2}, {Name: "state of fake_client0", Value: 1}}) {
		t.Fatalf("report %+v", r)
	}
	h.UnregisterDevice(d)
	h.UnregisterDevice(d)
	if got := rec.events()[before:]; !slices.Equal(got, []string{"add fake_client0", "remove fake_client0"}) {
		t.Fatalf("after UnregisterDevice twice: %q", got)
	}
	if v := d.ClientData(recKey{}); v != nil {
		t.Fatalf("client data after remove %v", v)
	}
}
