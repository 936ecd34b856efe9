package saclient

import (
	"slices"

	"github.com/softrdma/softrdma/verbs"
	"github.com/softrdma/softrdma/verbs/driver"
)

// The host's SA client serves every InfiniBand port of the host (the
// kernel's sa_query.c and multicast.c register an ib_client, and IPoIB
// joins each port's broadcast group): a port offers driver.MADPort, the
// client keeps the port's Agent and, as IPoIB would, its IPoIB broadcast
// membership. Providers know nothing of it.

// client is the SA client of every host (verbs.Client).
type client struct{}

// dataKey is the key of a port's state in its device's client data.
type dataKey struct{}

// portState is what the client keeps for one port.
type portState struct {
	e           *Agent
	unregister  func()
	unsubscribe func()
}

func init() { verbs.RegisterClient("saclient", client{}) }

// For returns the SA client and multicast join agent of dev's
// InfiniBand port; false when dev is not a port with an SA (it offers no
// driver.MADPort) or has left its host.
func For(dev *verbs.Device) (*Agent, bool) {
	st, ok := dev.ClientData(dataKey{}).(*portState)
	if !ok {
		return nil, false
	}
	return st.e, true
}

// agentEvent is the agent's reaction to a port's asynchronous event.
var agentEvent = map[verbs.AsyncEventType]EventKind{
	verbs.EventClientReregister: ClientReregister,
	verbs.EventLIDChange:        LIDChange,
	verbs.EventPortErr:          PortError,
	verbs.EventPortActive:       PortActive,
}

// Add starts the SA client of a port with an SA: it takes the port's QP1
// MADs and events, reads the SA's ClassPortInfo and joins the IPoIB
// broadcast group before the device is announced (as the port's
// activation did). The agent sees a port event before the device's
// other subscribers, which subscribe later.
func (client) Add(dev *verbs.Device) {
	mp, ok := verbs.Capability[driver.MADPort](dev)
	if !ok {
		return
	}
	timeout, retries := mp.SATimeout()
	e := New(mp, Config{Timeout: timeout, Retries: retries})
	st := &portState{e: e, unregister: mp.RegisterMADAgent(e.Receive)}
	if src, ok := verbs.Capability[driver.AsyncEventSource](dev); ok {
		st.unsubscribe = src.SubscribeAsync(func(ev verbs.AsyncEvent) {
			if k, ok := agentEvent[ev.Type]; ok {
				e.Event(k)
			}
		})
	}
	dev.SetClientData(dataKey{}, st)
	e.Refresh()
}

// Remove stops the port's SA client: pending requests fail with ENODEV.
func (client) Remove(dev *verbs.Device) {
	st, ok := dev.ClientData(dataKey{}).(*portState)
	if !ok {
		return
	}
	dev.SetClientData(dataKey{}, nil)
	if st.unsubscribe != nil {
		st.unsubscribe()
	}
	st.unregister()
	st.e.Close()
}

// InspectDevice adds the port's SA memberships (MLID, join state) to the
// device's report (verbs.ClientInspector).
func (client) InspectDevice(dev *verbs.Device, r *verbs.DeviceReport) {
	e, ok := For(dev)
	if !ok {
		return
	}
	ms := e.Memberships()
	for _, m := range ms {
		i := slices.IndexFunc(r.Groups, func(g verbs.GroupReport) bool { return g.MGID == m.MGID })
		if i < 0 {
			r.Groups = append(r.Groups, verbs.GroupReport{MGID: m.MGID})
			i = len(r.Groups) - 1
		}
		r.Groups[i].MLID, r.Groups[i].SAJoinState = m.MLID, m.JoinState
	}
	r.Usage = append(r.Usage, verbs.UsageCount{Name: "sa_memberships", Value: len(ms)})
	slices.SortFunc(r.Groups, func(a, b verbs.GroupReport) int { return slices.Compare(a.MGID[:], b.MGID[:]) })
}

var _ verbs.ClientInspector = client{}
