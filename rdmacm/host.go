package rdmacm

import (
	"sync"

	"github.com/softrdma/softrdma/verbs"
)

// cmState is the RDMA CM's state on one host (a verbs.Host): its devices
// (librdmacm's cma_device list), the bound ports of each port space, and
// the handles Inspect gives ids and channels. Event channels made with
// CreateEventChannelOn belong to a host; their ids use its state.
type cmState struct {
	host *verbs.Host

	devMu sync.Mutex
	devs  map[*verbs.Device]*cmDevice

	portMu sync.Mutex
	ports  map[portKey][]portOwner

	// migrateMu serializes MigrateID, the only code that holds two
	// channels' locks at once.
	migrateMu sync.Mutex

	// sidr is the state of UD connections (sidr.go), made on first use.
	sidrOnce sync.Once
	sidr     *sidrState

	// stats counts the host's joins, leaves and attach failures.
	stats mcStats

	handleMu sync.Mutex
	next     uint64
	ids      map[*ID]uint64
	chs      map[*EventChannel]uint64
}

type cmStateKey struct{}

// cmOf returns the CM state of a host.
func cmOf(h *verbs.Host) *cmState {
	return h.Value(cmStateKey{}, func() any {
		return &cmState{
			host: h, devs: map[*verbs.Device]*cmDevice{}, ports: map[portKey][]portOwner{},
			ids: map[*ID]uint64{}, chs: map[*EventChannel]uint64{},
		}
	}).(*cmState)
}

// CreateEventChannelOn opens an event channel whose ids use the devices of
// host h (CreateEventChannel uses verbs.DefaultHost).
func CreateEventChannelOn(h *verbs.Host) (_ *EventChannel, err error) {
	defer wrapErr(&err, "rdma_create_event_channel", nil)
	return newEventChannel(cmOf(h))
}
