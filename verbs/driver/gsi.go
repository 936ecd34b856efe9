package driver

import (
	"net/netip"
	"strconv"

	"github.com/softrdma/softrdma/ib/mad"
)

// GSIPort is the capability of a RoCE port whose QP1, the General
// Services Interface, carries the communication manager's MADs (what the
// kernel's ib_mad layer gives cm.c): the RDMA CM opens it for the SIDR
// exchange of UD ids (rdma_connect, rdma_accept and rdma_reject on an
// RDMA_PS_UDP or RDMA_PS_IPOIB id). The datagrams are RoCEv2 UD sends from
// QP1 to QP1 with P_Key 0xFFFF and the GSI Q_Key 0x80010000, as the
// kernel's rxe sends them.
type GSIPort interface {
	// OpenGSI opens the port's QP1 for agent, the one agent of the port
	// in this process (a second open is EBUSY until Close).
	OpenGSI(agent GSIAgent) (GSI, error)
}

// GSI is a port's QP1 opened by an agent.
type GSI interface {
	// Send sends one 256-byte MAD from QP1 to QP1 of dst, from the port's
	// GID sgidIndex, with the IP hop limit and traffic class given.
	Send(sgidIndex uint8, dst GID, hopLimit, tclass uint8, mad []byte) error
	// Claim makes the MADs that name key (GSIRoute) and that another
	// process of this user reads on the port's UDP port come to this
	// agent: on one host every process of the user shares UDP 4791 and
	// the kernel hands a datagram to one of them. A key another process
	// holds is EADDRINUSE. release gives it back.
	Claim(key string) (release func(), err error)
	// Close closes QP1 and releases every claim; no agent call runs
	// after it returns. It waits for a running agent call, so an agent
	// method must not call it (it may start a goroutine that does).
	Close() error
}

// GSIAgent receives what arrives on an open QP1. Its methods run on the
// port's receive path and must not block.
type GSIAgent interface {
	// Receive offers one MAD; it reports whether the agent took it. A
	// SIDR_REQ that no agent takes and no process of this user claims
	// (GSIRoute) is answered by the port with SIDR_REP status UNSUPPORTED,
	// as the kernel's CM answers one for a service nobody listens on.
	Receive(m *GSIMAD) bool
}

// GSIMAD is a MAD received on QP1, with the addressing of its datagram.
type GSIMAD struct {
	Src, Dst netip.Addr // the datagram's IP source and destination
	SrcQP    uint32
	PKey     uint16
	QKey     uint32
	HopLimit uint8
	TClass   uint8
	// MAD is the datagram's payload, valid during the call only.
	MAD []byte
}

// GSIRoute returns the key under which a process claims (GSI.Claim) a CM
// MAD: a SIDR_REQ goes to the listener of its service ID, a SIDR_REP to
// the process whose request ID it answers. "" for anything else.
func GSIRoute(b []byte) string {
	if mad.CheckCM(b) != nil {
		return ""
	}
	switch mad.MAD(b).AttrID() {
	case mad.AttrSIDRReq:
		return GSIServiceKey(mad.SIDRReq(b).ServiceID())
	case mad.AttrSIDRRep:
		return GSIRequestKey(mad.SIDRRep(b).RequestID())
	}
	return ""
}

// GSIServiceKey is the claim key of a listener's service ID.
func GSIServiceKey(sid uint64) string { return "cm-sid-" + strconv.FormatUint(sid, 16) }

// GSIRequestKey is the claim key of an outstanding SIDR_REQ's request ID.
func GSIRequestKey(id uint32) string { return "cm-req-" + strconv.FormatUint(uint64(id), 16) }
