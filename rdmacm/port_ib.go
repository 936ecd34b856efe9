package rdmacm

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"syscall"

	"github.com/softrdma/softrdma/ib/mad"
	"github.com/softrdma/softrdma/rdmacm/saclient"
	"github.com/softrdma/softrdma/verbs"
	"github.com/softrdma/softrdma/verbs/driver"
	"github.com/softrdma/softrdma/wire"
)

// ibPort is an InfiniBand port served by the host's SA client
// (rdmacm/saclient): joins are SA requests (cma_join_ib_multicast), the
// address stands for the port's IPoIB address.
type ibPort struct {
	name string
	sa   *saclient.Agent
}

// gidIndex: an IB port's IPoIB address stands for its port GID, index 0.
func (ibPort) gidIndex(*verbs.Context, netip.Addr) (uint8, error) { return 0, nil }

// ipoibQKey is the Q_Key of the broadcast group the port joined at
// activation.
func (p ibPort) ipoibQKey() (uint32, error) {
	bc, ok := p.sa.BroadcastGroup()
	if !ok {
		return 0, fmt.Errorf("no IPoIB broadcast group on %s: %w", p.name, syscall.EADDRNOTAVAIL)
	}
	return bc.QKey, nil
}

// join is cma_join_ib_multicast: the request starts from the port's IPoIB
// broadcast group record (none: EADDRNOTAVAIL), a send-only join needs the
// SA's send-only full member support (none: EOPNOTSUPP, as kernels
// 4.9-5.11 and the man page), and the SA join runs asynchronously: its
// answer becomes the join's event.
func (p ibPort) join(e *softEngine, mc *mcJoin) error {
	id := e.id
	bc, ok := p.sa.BroadcastGroup()
	if !ok {
		return fmt.Errorf("no IPoIB broadcast group on %s: %w", p.name, syscall.EADDRNOTAVAIL)
	}
	var mgid verbs.GID
	if mc.addr.family == afIB {
		mgid = mc.addr.ib.GID
	} else {
		group := mc.addr.ip.WithZone("").Unmap()
		if group.IsLoopback() {
			return fmt.Errorf("group address %v is a loopback address: %w", group, syscall.EINVAL)
		}
		mgid = wire.IBMGID(group, binary.BigEndian.Uint16(bc.MGID[4:6]), bc.MGID[1]&0x0f, id.ps == PS_UDP)
	}
	if _, err := e.defaultQKey(); err != nil {
		return err
	}
	if mc.sendOnly && !p.sa.SendOnlyFullMemberSupported() {
		return fmt.Errorf("SM does not support send-only full member joins: %w", syscall.EOPNOTSUPP)
	}
	req := bc
	req.MGID, req.QKey, req.PortGID, req.MLID = mgid, e.qkey, p.sa.PortGID(), 0
	req.JoinState = mad.JoinFullMember
	if mc.sendOnly {
		req.JoinState = mad.JoinSendOnlyFullMember
	}
	mask := mad.CompCreateRequired
	if id.ps == PS_IPOIB {
		mask = mad.CompIPoIBJoin
	}
	mc.qkey = e.qkey
	m, err := p.sa.Join(req, mask, func(status int, rec *saclient.GroupRecord) { ibJoinDone(id, mc, status, rec) })
	if err != nil {
		return err
	}
	mc.held = m
	return nil
}

// ibJoinDone turns the SA's answer (or a later -ENETRESET) into the
// join's event (cma_ib_mc_handler).
func ibJoinDone(id *ID, mc *mcJoin, status int, rec *saclient.GroupRecord) {
	if mc.left.Load() {
		return
	}
	if status == 0 && (rec.QKey == 0 || rec.QKey != mc.qkey) {
		status = -int(syscall.EINVAL) // cma_set_qkey: the group's Q_Key is not the id's
	}
	ev := &Event{ID: id, mc: mc}
	if status != 0 {
		ev.Event, ev.Status = EventMulticastError, status
		ev.Param.PrivateData = mc.context
		id.queue(ev)
		return
	}
	ev.Event = EventMulticastJoin
	ev.Param = UDParam{
		PrivateData: mc.context,
		QPNum:       MulticastQPN,
		QKey:        rec.QKey,
		AHAttr: verbs.AHAttr{
			GRH: verbs.GlobalRoute{
				DGID: rec.MGID, SGIDIndex: 0, FlowLabel: rec.FlowLabel,
				HopLimit: rec.HopLimit, TrafficClass: rec.TClass,
			},
			DLID:       rec.MLID,
			SL:         rec.SL,
			StaticRate: rec.Rate,
			IsGlobal:   true,
			PortNum:    1,
		},
	}
	id.queue(ev)
}

// leave leaves the SA membership; it waits for a running callback of the
// group, and none runs afterwards. The returned wait waits for the SA
// Delete of the join states no other local join needs (rdmacm/saclient).
func (p ibPort) leave(mc *mcJoin) func() error {
	m, ok := mc.held.(*saclient.Member)
	mc.held = nil
	if !ok {
		return nil
	}
	return p.sa.StartLeave(m).Wait
}

// subscribe: an IB port reports its changes (reregister, LID change)
// through its joins' callbacks, not as netdev events.
func (ibPort) subscribe(func(driver.NetdevEvent)) (cancel func()) { return nil }
