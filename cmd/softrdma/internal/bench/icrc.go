package bench

import (
	"hash/crc32"
	"net/netip"
	"sync/atomic"
	"time"

	"github.com/softrdma/softrdma/wire"
)

// ICRCResult compares the ICRC of a RoCEv2 UD datagram with hash/crc32
// over the same number of bytes (the baseline), and gives the receive
// side's check (wire.SolveIPv4ID, which also recovers the hidden IP ID).
type ICRCResult struct {
	Kind    string  `json:"kind"` // "icrc"
	Size    int     `json:"size"` // payload bytes
	Hashed  int     `json:"hashed_bytes"`
	ICRCNs  float64 `json:"icrc_ns"`
	CRC32Ns float64 `json:"crc32_ns"`
	SolveNs float64 `json:"solve_ns"`
	// Ratio is the ICRC's throughput relative to hash/crc32's (crc32 time
	// / ICRC time; 1 = as fast).
	Ratio float64 `json:"ratio"`
}

// frame is a RoCEv2 UD datagram over IPv4 with its headers.
type frame struct {
	ip   wire.IPv4
	udp  wire.UDP
	body []byte // BTH … pad
	icrc uint32
}

func newFrame(size int) frame {
	h := wire.UDHeader{PKey: wire.DefaultPKey, DestQP: wire.MulticastQPN, PSN: 1, QKey: 0x01234567, SrcQP: 0xC00001}
	b := make([]byte, wire.UDLen(size, false))
	n := wire.EncodeUD(b, &h, make([]byte, size))
	f := frame{ip: make(wire.IPv4, wire.IPv4HeaderLen), udp: make(wire.UDP, wire.UDPHeaderLen), body: b[:n]}
	f.ip.Encode(wire.IPv4Fields{TotalLength: uint16(28 + len(b)), DF: true, TTL: 64, Protocol: wire.IPProtocolUDP,
		Src: netip.MustParseAddr("127.0.0.1"), Dst: netip.MustParseAddr("239.1.1.1")})
	f.udp.Encode(0xC000, wire.UDPPort, uint16(8+len(b)))
	f.icrc = wire.ICRCv4(f.ip, f.udp, f.body)
	return f
}

// timeOp returns the mean time of one call of op, run for about d.
func timeOp(d time.Duration, op func()) float64 {
	n := 1
	for {
		start := time.Now()
		for range n {
			op()
		}
		el := time.Since(start)
		if el >= d/8 || n >= 1<<30 {
			m := int(float64(n) * float64(d) / float64(max(el, time.Microsecond)))
			if m <= n {
				return float64(el.Nanoseconds()) / float64(n)
			}
			start = time.Now()
			for range m {
				op()
			}
			return float64(time.Since(start).Nanoseconds()) / float64(m)
		}
		n *= 4
	}
}

// sink keeps the measured results alive.
var sink atomic.Uint32

func measureICRC(size int, d time.Duration) ICRCResult {
	f := newFrame(size)
	hashed := 8 + wire.IPv4HeaderLen + wire.UDPHeaderLen + len(f.body)
	plain := make([]byte, hashed)
	r := ICRCResult{Kind: "icrc", Size: size, Hashed: hashed}
	var x uint32
	r.ICRCNs = timeOp(d, func() { x ^= wire.ICRCv4(f.ip, f.udp, f.body) })
	r.CRC32Ns = timeOp(d, func() { x ^= crc32.ChecksumIEEE(plain) })
	hidden := make(wire.IPv4, wire.IPv4HeaderLen)
	copy(hidden, f.ip)
	hidden.SetID(0)
	hidden.SetDF(false)
	r.SolveNs = timeOp(d, func() {
		id, _, _ := wire.SolveIPv4ID(hidden, f.udp, f.body, f.icrc)
		x ^= uint32(id)
	})
	sink.Store(x)
	r.Ratio = r.CRC32Ns / r.ICRCNs
	return r
}
