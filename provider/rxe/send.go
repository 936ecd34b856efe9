package rxe

import (
	"hash/crc32"
	"net/netip"
	"sync"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/softrdma/softrdma/internal/sys/mmsg"
	"github.com/softrdma/softrdma/provider/softverbs"
	"github.com/softrdma/softrdma/verbs"
	"github.com/softrdma/softrdma/wire"
)

// The send path. A datagram goes out as three pieces gathered by the
// kernel (one iovec each): the transport headers built here, the payload
// straight from the caller's memory (no copy) and the pad and ICRC. A
// batch (softverbs.BatchSender) is one sendmmsg per run of datagrams of one
// address family. The scratch space of a batch comes from a pool, so an
// idle QP holds none.

// Send transmits one UD datagram (softverbs.DriverQP). The AH must be global:
// its DGID gives the destination IP (IPv4-mapped → IPv4, else IPv6), its
// SGID index the source (an entry of port 1's GID table of the same family,
// else EINVAL), its hop limit the IP TTL and its traffic class the TOS.
// A payload larger than the active MTU is counted and not sent, and Send
// returns nil, as rxe completes such sends successfully. The packet is
// BTH (P_Key 0xFFFF, the QP's next PSN) / DETH (RemoteQKey as given, the
// QP's QPN) / [ImmDt] / payload / pad / ICRC, the ICRC computed over the
// IP header the kernel emits (DF set, ID 0).
func (q *qp) Send(s *softverbs.UDSend) error {
	var errs [1]error
	q.sendBatch(unsafe.Slice(s, 1), errs[:])
	return errs[0]
}

// SendBatch transmits the datagrams in order (softverbs.BatchSender), each as
// Send would, with one sendmmsg per run of datagrams of one family; errs[i]
// is what Send(&s[i]) would have returned.
func (q *qp) SendBatch(s []softverbs.UDSend, errs []error) { q.sendBatch(s, errs) }

// sendSlot is one datagram of a batch: its headers, pad and ICRC, the IP
// header the ICRC covers, destination and control messages.
type sendSlot struct {
	hdr    [wire.BTHLen + wire.DETHLen + wire.ImmDtLen + wire.ICRCLen]byte
	tail   [3 + wire.ICRCLen]byte // pad and ICRC
	ip     [wire.IPv6HeaderLen]byte
	udp    [wire.UDPHeaderLen]byte
	name   [unix.SizeofSockaddrInet6]byte
	oob    [sendOOBSpace]byte
	iov    [3]unix.Iovec
	hlen   int
	tlen   int
	ipLen  int
	oobLen int
	total  int // UDP payload bytes
	idx    int // index of the datagram in the caller's batch
}

// sendScratch is the scratch space of one batch.
type sendScratch struct {
	slots [softverbs.MaxSendBatch]sendSlot
	hs    [softverbs.MaxSendBatch]unix.Mmsghdr
	snd   mmsg.Sender // sendmmsg of hs
}

var scratchPool = sync.Pool{New: func() any {
	sc := &sendScratch{}
	sc.snd.Init()
	return sc
}}

// zeroPad is the pad the ICRC covers.
var zeroPad [3]byte

func (q *qp) sendBatch(s []softverbs.UDSend, errs []error) {
	sc := scratchPool.Get().(*sendScratch)
	defer scratchPool.Put(sc)
	q.smu.Lock()
	defer q.smu.Unlock()
	k, v6 := 0, false
	for i := range s {
		errs[i] = nil
		us := &s[i]
		if k == len(sc.slots) || k > 0 && us.AH != nil && us.AH.IsGlobal && us.AH.GRH.DGID.Addr().Is4() == v6 {
			q.transmit(sc, k, v6, s, errs)
			k = 0
		}
		fam6, send, err := q.build(&sc.slots[k], us)
		if err != nil || !send {
			errs[i] = err
			continue
		}
		sc.slots[k].idx = i
		k, v6 = k+1, fam6
	}
	if k > 0 {
		q.transmit(sc, k, v6, s, errs)
	}
}

// build checks one datagram and writes it into sl. send is false for a
// datagram that is counted and not sent (larger than the active MTU).
// q.smu is held.
func (q *qp) build(sl *sendSlot, s *softverbs.UDSend) (v6, send bool, err error) {
	d := q.dev
	ah := s.AH
	if ah == nil || !ah.IsGlobal {
		return false, false, d.errf(syscall.EINVAL, "send: address handle without GRH")
	}
	info := d.info.Load()
	sgid, ok := info.gid(int(ah.GRH.SGIDIndex))
	if !ok {
		info, _ = d.refreshInfo()
		if sgid, ok = info.gid(int(ah.GRH.SGIDIndex)); !ok {
			return false, false, d.errf(syscall.EINVAL, "send: no GID at index %d", ah.GRH.SGIDIndex)
		}
	}
	src := sgid.GID.Addr()
	dst := ah.GRH.DGID.Addr()
	if src.Is4() != dst.Is4() || !dst.IsValid() || dst.IsUnspecified() {
		return false, false, d.errf(syscall.EINVAL, "send: source %v, destination %v", src, dst)
	}
	if len(s.Payload) > info.activeMTU().Bytes() {
		return false, false, nil // Wire stays 0: the core counts the drop
	}
	if q.dead.Load() {
		return false, false, d.errf(syscall.EINVAL, "send: qp %#x destroyed", q.qpn)
	}
	v6 = !dst.Is4()
	if v6 && q.blk.conn6 == nil {
		return false, false, d.errf(syscall.EAFNOSUPPORT, "send: no IPv6 socket")
	}

	psn := s.PSN
	h := wire.UDHeader{
		Solicited: s.Solicited,
		PKey:      wire.DefaultPKey,
		DestQP:    s.RemoteQPN & 0xFFFFFF,
		PSN:       psn,
		QKey:      s.RemoteQKey,
		SrcQP:     q.qpn,
		HasImm:    s.HasImm,
		Imm:       s.Imm,
	}
	if q.gsi {
		h.SrcQP = gsiQPN
	}
	sl.hlen = wire.EncodeUD(sl.hdr[:], &h, nil)
	pad := -len(s.Payload) & 3
	wire.BTH(sl.hdr[:wire.BTHLen]).SetPadCount(pad)
	sl.total = sl.hlen + len(s.Payload) + pad + wire.ICRCLen
	sl.tlen = pad + wire.ICRCLen
	clear(sl.tail[:pad])
	hop, tc := ah.GRH.HopLimit, ah.GRH.TrafficClass
	key := sendFlowKey{src: src, dst: dst, hop: hop, tc: tc, total: sl.total}
	f := &q.flow
	if !f.ok || f.key != key {
		q.newFlow(key, v6)
	}
	sl.ipLen = f.ipLen
	sl.ip = f.ip
	sl.udp = f.udp
	crc := f.prefix.ICRC(sl.hdr[:sl.hlen])
	// The destination's flow information and scope are 0: IPV6_PKTINFO
	// names the interface.
	mmsg.PutAddrPort(sl.name[:], netip.AddrPortFrom(dst, wire.UDPPort))
	var oob []byte
	if !v6 {
		oob = buildOOB4(sl.oob[:], d.ifindex, src, dst, q.blk.mcSrc4, hop, tc)
	} else {
		oob = buildOOB6(sl.oob[:], d.ifindex, src, hop, tc)
	}
	// The ICRC runs on over the payload and the pad (CRC-32 streams).
	crc = crc32.Update(crc, crc32.IEEETable, s.Payload)
	crc = crc32.Update(crc, crc32.IEEETable, zeroPad[:pad])
	wire.PutICRC(sl.tail[pad:], crc)
	sl.oobLen = len(oob)
	return v6, true, nil
}

// sendFlowKey is what the IP and UDP headers of a datagram a QP sends are
// made of (the source port is the QP's send socket's).
type sendFlowKey struct {
	src, dst netip.Addr
	hop, tc  uint8
	total    int // UDP payload bytes
}

// sendFlow is a QP's last flow: its headers as the kernel emits them and
// their ICRC prefix.
type sendFlow struct {
	key    sendFlowKey
	ok     bool
	ipLen  int
	ip     [wire.IPv6HeaderLen]byte
	udp    [wire.UDPHeaderLen]byte
	prefix wire.ICRCPrefix
}

// newFlow builds the headers of flow key into q.flow (q.smu held): IPv4
// with ID 0 and DF, as the send socket's IP_PMTUDISC_DO makes the kernel
// send them.
func (q *qp) newFlow(key sendFlowKey, v6 bool) {
	f := &q.flow
	port := q.blk.port4
	if v6 {
		port = q.blk.port6
	}
	f.ipLen, f.prefix = encodeHeaders(&f.ip, &f.udp, flowHeaders{
		src: key.src, dst: key.dst, srcPort: port, tos: key.tc, ttl: key.hop, n: key.total, v6: v6,
	})
	f.key, f.ok = key, true
}

// flowHeaders is what the IP and UDP headers of a RoCEv2 datagram are made
// of: addresses, source port (the destination port is 4791), TOS or traffic
// class, TTL or hop limit, IPv6 flow label, UDP payload bytes.
type flowHeaders struct {
	src, dst netip.Addr
	srcPort  uint16
	tos, ttl uint8
	flow     uint32
	n        int
	v6       bool
}

// encodeHeaders writes the IP header of h into ip and its UDP header into
// udp, as the kernel emits them for a send socket of the device (IPv4: ID 0
// and DF, IP_PMTUDISC_DO), and returns the IP header's length and the ICRC
// prefix of the two. The sender and the receiver of a flow share it.
func encodeHeaders(ip *[wire.IPv6HeaderLen]byte, udp *[wire.UDPHeaderLen]byte, h flowHeaders) (int, wire.ICRCPrefix) {
	u := wire.UDP(udp[:])
	u.Encode(h.srcPort, wire.UDPPort, uint16(wire.UDPHeaderLen+h.n))
	if !h.v6 {
		ip4 := wire.IPv4(ip[:wire.IPv4HeaderLen])
		ip4.Encode(wire.IPv4Fields{
			TOS:         h.tos,
			TotalLength: uint16(wire.IPv4HeaderLen + wire.UDPHeaderLen + h.n),
			DF:          true,
			TTL:         h.ttl,
			Protocol:    wire.IPProtocolUDP,
			Src:         h.src,
			Dst:         h.dst,
		})
		return wire.IPv4HeaderLen, wire.ICRCPrefixV4(ip4, u)
	}
	ip6 := wire.IPv6(ip[:])
	ip6.Encode(wire.IPv6Fields{
		TrafficClass:  h.tos,
		FlowLabel:     h.flow,
		PayloadLength: uint16(wire.UDPHeaderLen + h.n),
		NextHeader:    wire.IPProtocolUDP,
		HopLimit:      h.ttl,
		Src:           h.src,
		Dst:           h.dst,
	})
	return wire.IPv6HeaderLen, wire.ICRCPrefixV6(ip6, u)
}

// transmit sends the k datagrams built in sc.slots (all of one family)
// with sendmmsg, records their outcome in errs and counts them. q.smu is
// held.
func (q *qp) transmit(sc *sendScratch, k int, v6 bool, s []softverbs.UDSend, errs []error) {
	raw, nameLen := q.blk.raw4, uint32(unix.SizeofSockaddrInet4)
	if v6 {
		raw, nameLen = q.blk.raw6, unix.SizeofSockaddrInet6
	}
	for j := range k {
		sl := &sc.slots[j]
		p := s[sl.idx].Payload
		sl.iov[0].Base = &sl.hdr[0]
		sl.iov[0].SetLen(sl.hlen)
		n := 1
		if len(p) > 0 {
			sl.iov[1].Base = &p[0]
			sl.iov[1].SetLen(len(p))
			n++
		}
		sl.iov[n].Base = &sl.tail[0]
		sl.iov[n].SetLen(sl.tlen)
		h := &sc.hs[j].Hdr
		h.Name = &sl.name[0]
		h.Namelen = nameLen
		h.Iov = &sl.iov[0]
		h.SetIovlen(n + 1)
		h.Control = &sl.oob[0]
		h.SetControllen(sl.oobLen)
		h.Flags = 0
	}
	for off := 0; off < k; {
		n, errno, err := sc.snd.Send(raw, sc.hs[off:k])
		if err != nil {
			for j := off; j < k; j++ {
				q.sendFailed(&s[sc.slots[j].idx], &errs[sc.slots[j].idx], err)
			}
			break
		}
		if errno != 0 {
			j := sc.slots[off].idx
			q.sendFailed(&s[j], &errs[j], errno)
			n = 1
		}
		off += n
	}
	for j := range k {
		sl := &sc.slots[j]
		if errs[sl.idx] == nil {
			s[sl.idx].Wire = sl.total
			if q.dev.core.Tapping() {
				q.captureSlot(sl, s[sl.idx].Payload)
			}
		}
		sl.iov[1].Base = nil // keep no reference to the caller's memory
	}
}

// sendFailed records the failure of one datagram.
func (q *qp) sendFailed(s *softverbs.UDSend, errp *error, err error) {
	d := q.dev
	*errp = d.errf(verbs.ErrnoOf(err), "send to %v: %v", s.AH.GRH.DGID.Addr(), err)
}

// captureSlot hands a sent datagram to the capture, assembled in one piece.
func (q *qp) captureSlot(sl *sendSlot, payload []byte) {
	roce := make([]byte, 0, sl.total)
	roce = append(roce, sl.hdr[:sl.hlen]...)
	roce = append(roce, payload...)
	roce = append(roce, sl.tail[:sl.tlen]...)
	captureSent(q.dev, sl.ip[:sl.ipLen], sl.udp[:], roce)
}
