package rdmacm

import (
	"log/slog"
	"net"
	"slices"
	"sync/atomic"

	"github.com/softrdma/softrdma/logging"
	"github.com/softrdma/softrdma/verbs"
)

// This file is the CM's read-only side for operator tools: a snapshot of
// the ids and their joins (Inspect), counters of joins and leaves
// (Stats), and structured logs of control-plane events (SetLogger).

// IDInfo is a read-only view of one RDMA CM id.
type IDInfo struct {
	// Handle numbers the id within the process; it stays the same for the
	// id's life as long as Inspect is called at least once in between.
	Handle uint64
	// Channel is the Handle of the id's event channel (ChannelInfo).
	Channel   uint64
	PortSpace PortSpace
	// State is the kernel's rdma_cm_state name without its prefix, e.g.
	// "ADDR_BOUND", "ADDR_RESOLVED", "DESTROYING".
	State string
	// Sync reports a synchronous id (created without a channel).
	Sync   bool
	Device string
	Src    net.Addr // nil when unbound
	Dst    net.Addr // nil when no address was resolved
	// QPN is the number of the id's QP; 0 when the id has none.
	QPN  uint32
	QKey uint32
	// Joins are the id's joins, newest first (the order LeaveMulticast
	// searches them in).
	Joins []JoinInfo
	// EventsQueued counts the id's events not yet retrieved; EventsUnacked
	// the retrieved ones not yet acked (LeaveMulticast and Destroy wait for
	// them).
	EventsQueued  int
	EventsUnacked int
}

// JoinInfo is a read-only view of one join of an id.
type JoinInfo struct {
	// Addr is the address given to the join.
	Addr net.Addr
	// SendOnly reports a send-only full-member join
	// (MCJoinFlagSendOnlyFullMember); otherwise a full member.
	SendOnly bool
	// Joined reports that the join's MULTICAST_JOIN event was retrieved:
	// MGID and MLID are known, and a full member's QP was attached then.
	Joined bool
	MGID   verbs.GID
	MLID   uint16
	// MembershipRef reports that the join holds a reference on the
	// device's IP multicast membership (a RoCE full-member join).
	MembershipRef bool
	// EventsQueued and EventsUnacked are the id's counts restricted to
	// the join's events.
	EventsQueued  int
	EventsUnacked int
}

// ChannelInfo is a read-only view of an event channel.
type ChannelInfo struct {
	Handle uint64
	// Queued counts the events waiting to be retrieved (the channel's
	// queue depth).
	Queued int
	// IDs counts the ids created on the channel and not yet destroyed.
	IDs         int
	NonBlocking bool
	Closed      bool
}

// Inspection is what Inspect returns.
type Inspection struct {
	IDs      []IDInfo      // by Handle
	Channels []ChannelInfo // by Handle
	Stats    MulticastStats
}

// MulticastStats counts a host's multicast control-plane operations since
// it was made (verbs.DefaultHost: since the process started).
type MulticastStats struct {
	// Joins counts JoinMulticast/JoinMulticastEx calls that succeeded.
	Joins uint64
	// JoinErrors counts join calls that failed synchronously.
	JoinErrors uint64
	// Leaves counts joins removed by LeaveMulticast or Destroy.
	Leaves uint64
	// AttachErrors counts MULTICAST_JOIN events turned into
	// MULTICAST_ERROR because the QP attach failed.
	AttachErrors uint64
}

// mcStats are a host's counts (cmState.stats).
type mcStats struct {
	joins, joinErrors, leaves, attachErrors atomic.Uint64
}

// Stats returns the multicast operation counts of verbs.DefaultHost.
func Stats() MulticastStats { return StatsHost(verbs.DefaultHost()) }

// StatsHost returns the multicast operation counts of host h.
func StatsHost(h *verbs.Host) MulticastStats {
	st := &cmOf(h).stats
	return MulticastStats{
		Joins:        st.joins.Load(),
		JoinErrors:   st.joinErrors.Load(),
		Leaves:       st.leaves.Load(),
		AttachErrors: st.attachErrors.Load(),
	}
}

// handleOf returns the handle Inspect gives k, numbering it when new.
func handleOf[K comparable](next *uint64, m map[K]uint64, k K, seen map[K]bool) uint64 {
	seen[k] = true
	if h, ok := m[k]; ok {
		return h
	}
	*next++
	m[k] = *next
	return *next
}

// stateNames are the kernel's rdma_cm_state names.
var stateNames = [...]string{
	stateIdle:          "IDLE",
	stateAddrQuery:     "ADDR_QUERY",
	stateAddrResolved:  "ADDR_RESOLVED",
	stateRouteQuery:    "ROUTE_QUERY",
	stateRouteResolved: "ROUTE_RESOLVED",
	stateConnect:       "CONNECT",
	stateDisconnect:    "DISCONNECT",
	stateAddrBound:     "ADDR_BOUND",
	stateListen:        "LISTEN",
	stateDeviceRemoval: "DEVICE_REMOVAL",
	stateDestroying:    "DESTROYING",
}

// stateName returns a state's kernel name without its RDMA_CM_ prefix.
func stateName(s state) string {
	if int(s) < len(stateNames) {
		return stateNames[s]
	}
	return "UNKNOWN"
}

// Inspect returns a snapshot of the process's RDMA CM ids that are bound
// to a device (an id not bound yet, or bound to the wildcard address, has
// no device and is not listed), of their event channels, and the
// multicast counters. Each id is read under its own lock, so the snapshot
// is consistent per id, not across ids.
func Inspect() Inspection { return InspectHost(verbs.DefaultHost()) }

// InspectHost is Inspect for the ids of another host.
func InspectHost(h *verbs.Host) Inspection {
	cm := cmOf(h)
	cm.devMu.Lock()
	cds := make([]*cmDevice, 0, len(cm.devs))
	for _, cd := range cm.devs {
		cds = append(cds, cd)
	}
	cm.devMu.Unlock()
	var ids []*ID
	for _, cd := range cds {
		cd.mu.Lock()
		for id := range cd.ids {
			ids = append(ids, id)
		}
		cd.mu.Unlock()
	}

	cm.handleMu.Lock()
	defer cm.handleMu.Unlock()
	handles := cm
	seenIDs := map[*ID]bool{}
	seenChs := map[*EventChannel]bool{}
	// Number new ids in a stable order: by their existing handle, new
	// ones after, as found.
	slices.SortStableFunc(ids, func(a, b *ID) int {
		ha, hb := handles.ids[a], handles.ids[b]
		switch {
		case ha == hb:
			return 0
		case ha == 0:
			return 1
		case hb == 0:
			return -1
		case ha < hb:
			return -1
		}
		return 1
	})

	var out Inspection
	var chs []*EventChannel
	for _, id := range ids {
		info := IDInfo{Handle: handleOf(&handles.next, handles.ids, id, seenIDs)}
		if !seenChs[id.ch()] {
			chs = append(chs, id.ch())
		}
		info.Channel = handleOf(&handles.next, handles.chs, id.ch(), seenChs)
		info.PortSpace = id.ps
		info.Sync = id.isSync()

		id.mu.Lock()
		info.State = stateName(id.state)
		a := id.eng.addrs()
		if a.dev != nil {
			info.Device = a.dev.ctx.Device().Name()
		}
		info.Src = a.src.netAddr()
		info.Dst = a.dst.netAddr()
		if id.qp != nil {
			info.QPN = id.qp.Num()
		}
		info.QKey = a.qkey
		mcs := slices.Clone(id.mcs)
		for _, mc := range mcs {
			info.Joins = append(info.Joins, JoinInfo{
				Addr:          mc.addr.netAddr(),
				SendOnly:      mc.sendOnly,
				Joined:        !mc.mgid.IsZero(),
				MGID:          mc.mgid,
				MLID:          mc.mlid,
				MembershipRef: mc.netRef,
			})
		}
		id.mu.Unlock()

		ch := id.lockCh()
		for _, ev := range ch.queue {
			if ev.ID != id {
				continue
			}
			info.EventsQueued++
			if i := slices.Index(mcs, ev.mc); ev.mc != nil && i >= 0 {
				info.Joins[i].EventsQueued++
			}
		}
		info.EventsUnacked = id.ev.reported - id.ev.completed
		for i, mc := range mcs {
			info.Joins[i].EventsUnacked = mc.eventsReported - mc.eventsCompleted
		}
		ch.mu.Unlock()
		out.IDs = append(out.IDs, info)
	}
	for _, ch := range chs {
		ch.mu.Lock()
		out.Channels = append(out.Channels, ChannelInfo{
			Handle:      handles.chs[ch],
			Queued:      len(ch.queue),
			IDs:         ch.ids,
			NonBlocking: ch.nonblock,
			Closed:      ch.closed,
		})
		ch.mu.Unlock()
	}
	for id := range handles.ids {
		if !seenIDs[id] {
			delete(handles.ids, id)
		}
	}
	for ch := range handles.chs {
		if !seenChs[ch] {
			delete(handles.chs, ch)
		}
	}
	slices.SortFunc(out.IDs, func(a, b IDInfo) int { return cmpU64(a.Handle, b.Handle) })
	slices.SortFunc(out.Channels, func(a, b ChannelInfo) int { return cmpU64(a.Handle, b.Handle) })
	out.Stats = StatsHost(h)
	return out
}

func cmpU64(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// SetLogger sends the CM's control-plane events to l as structured logs:
// joins and leaves (Info), joins that fail synchronously (Warn), and QP
// attach failures that turn a MULTICAST_JOIN into MULTICAST_ERROR (Error).
// A nil l turns the logs off (the default).
func SetLogger(l *slog.Logger) { logging.SetLogger(l) }

// joinFlagName names a join type in logs and tools.
func joinFlagName(sendOnly bool) string {
	if sendOnly {
		return "send-only"
	}
	return "full"
}

// observeJoin counts and logs a join call (called without id.mu held).
func observeJoin(id *ID, sa sockaddr, flags uint32, err error) {
	st := &id.ch().cm.stats
	if err != nil {
		st.joinErrors.Add(1)
	} else {
		st.joins.Add(1)
	}
	l := logging.Logger()
	if l == nil {
		return
	}
	attrs := []any{
		slog.String("device", id.DeviceName()),
		addrAttr("id", id.SrcAddr()),
		slog.String("ps", id.ps.String()),
		addrAttr("group", sa.netAddr()),
		slog.String("join", joinFlagName(flags == MCJoinFlagSendOnlyFullMember)),
	}
	if err != nil {
		l.Warn("multicast join failed", append(attrs, slog.Any("err", err))...)
		return
	}
	l.Info("multicast join", attrs...)
}

// observeLeave counts and logs a join's removal (called with id.mu held).
func observeLeave(id *ID, mc *mcJoin) {
	id.ch().cm.stats.leaves.Add(1)
	l := logging.Logger()
	if l == nil {
		return
	}
	a := id.eng.addrs()
	dev := ""
	if a.dev != nil {
		dev = a.dev.ctx.Device().Name()
	}
	l.Info("multicast leave",
		slog.String("device", dev),
		addrAttr("id", a.src.netAddr()),
		slog.String("ps", id.ps.String()),
		addrAttr("group", mc.addr.netAddr()),
		slog.String("join", joinFlagName(mc.sendOnly)),
		slog.Bool("destroying", id.state == stateDestroying),
	)
}

// observeAttachError counts and logs a failed attach at JOIN retrieval
// (called with id.mu held).
func observeAttachError(id *ID, mc *mcJoin, err error) {
	id.ch().cm.stats.attachErrors.Add(1)
	l := logging.Logger()
	if l == nil {
		return
	}
	a := id.eng.addrs()
	dev := ""
	if a.dev != nil {
		dev = a.dev.ctx.Device().Name()
	}
	l.Error("multicast attach failed: MULTICAST_JOIN becomes MULTICAST_ERROR",
		slog.String("device", dev),
		addrAttr("id", a.src.netAddr()),
		addrAttr("group", mc.addr.netAddr()),
		slog.String("mgid", mc.mgid.String()),
		slog.Any("err", err),
	)
}

// addrAttr renders an address as a string attribute: an IP address with
// port 0 (a group) as the bare address, otherwise address:port.
func addrAttr(key string, a net.Addr) slog.Attr {
	switch v := a.(type) {
	case nil:
		return slog.String(key, "")
	case *net.UDPAddr:
		if v == nil {
			return slog.String(key, "")
		}
		if v.Port == 0 {
			return slog.String(key, v.IP.String())
		}
	}
	return slog.String(key, a.String())
}
