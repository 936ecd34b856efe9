package rxe

import (
	"errors"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/gopacket/gopacket/pcapgo"
	"golang.org/x/sys/unix"

	"github.com/softrdma/softrdma/provider/softverbs"
	"github.com/softrdma/softrdma/test/testenv"
	"github.com/softrdma/softrdma/wire"
)

// rxeTestdata holds frames captured from real Linux Soft-RoCE, in the
// repository (<clone>/provider/rxe → <clone>/testdata/rxe).
const rxeTestdata = "../../testdata/rxe"

// readRoCEFrames returns the IPv4 packets (IP header onwards) to UDP 4791
// in a pcap file of Ethernet frames.
func readRoCEFrames(t *testing.T, path string) [][]byte {
	t.Helper()
	fh, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	r, err := pcapgo.NewReader(fh)
	if err != nil {
		t.Fatal(err)
	}
	var out [][]byte
	for {
		data, _, err := r.ReadPacketData()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		if len(data) < 14+28 || data[12] != 0x08 || data[13] != 0x00 {
			continue
		}
		ip := data[14:]
		if ip[0] != 0x45 || ip[9] != 17 || wire.UDP(ip[20:]).DstPort() != wire.UDPPort {
			continue
		}
		pkt := append([]byte(nil), ip[:wire.IPv4(ip).TotalLength()]...)
		// Host-built frames were captured before checksum offload (their
		// UDP checksum is a partial sum); IPv4 allows none, and the ICRC
		// masks it.
		wire.UDP(pkt[20:]).SetChecksum(0)
		out = append(out, pkt)
	}
}

// TestReplayRealRxeFrames sends the frames captured from Linux rxe (with
// their real, changing IP IDs and ICRCs) through a raw socket to lo of a
// private network namespace, and checks that the device accepts the good
// ones (solving the unknown IP ID) and drops the negative vectors.
func TestReplayRealRxeFrames(t *testing.T) {
	if !inNetns(t) {
		return
	}
	ipCmd(t, "link", "set", "lo", "up")
	d, err := ForName("lo")
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	group := netip.MustParseAddr("239.1.1.1") // the captures' group; this namespace is private
	rx := newFakeRx()
	q := newQP(t, d, rx, 0, 0x01234567)
	if err := q.AttachMcast(mgid(group), 0); err != nil {
		t.Fatal(err)
	}
	raw := newRawSender(t)

	type want struct{ delivered, icrc, qkey int }
	files := map[string]want{
		"e1_full.pcap":     {delivered: 10},
		"e2_sendonly.pcap": {delivered: 10},
		"igmpv2.pcap":      {delivered: 5},
		"e4_host_raw.pcap": {delivered: 5},
		"e5_negative.pcap": {icrc: 5, qkey: 5},
	}
	for name, w := range files {
		t.Run(name, func(t *testing.T) {
			frames := readRoCEFrames(t, filepath.Join(rxeTestdata, name))
			before := d.Counters()
			var ids []uint16
			for _, f := range frames {
				raw.send(t, f)
				ids = append(ids, wire.IPv4(f).ID())
			}
			eventually(t, "all frames read", func() bool {
				return d.Counters().Get(softverbs.RcvdPkts) == before.Get(softverbs.RcvdPkts)+uint64(len(frames))
			})
			eventually(t, "all frames handled", func() bool {
				c := d.Counters()
				return c.Get(softverbs.Delivered)+c.Get(softverbs.ICRCErrors)+c.Get(softverbs.QKeyViolations) == before.Get(softverbs.Delivered)+before.Get(softverbs.ICRCErrors)+before.Get(softverbs.QKeyViolations)+uint64(len(frames))
			})
			c := d.Counters()
			if int(c.Get(softverbs.Delivered)-before.Get(softverbs.Delivered)) != w.delivered || int(c.Get(softverbs.ICRCErrors)-before.Get(softverbs.ICRCErrors)) != w.icrc ||
				int(c.Get(softverbs.QKeyViolations)-before.Get(softverbs.QKeyViolations)) != w.qkey {
				t.Errorf("%d frames: delivered %d, ICRC errors %d, Q_Key violations %d; want %+v", len(frames),
					c.Get(softverbs.Delivered)-before.Get(softverbs.Delivered), c.Get(softverbs.ICRCErrors)-before.Get(softverbs.ICRCErrors), c.Get(softverbs.QKeyViolations)-before.Get(softverbs.QKeyViolations), w)
			}
			for i := 0; i < w.delivered; i++ {
				got := rx.wait(t)
				ip := wire.IPv4(got.grh[20:])
				if ip.ID() != ids[i] || !ip.DF() || ip.Dst() != group || ip.Checksum() != ip.CalculateChecksum() ||
					!bytesEqual(got.grh[20:40], frames[i][:20]) {
					t.Errorf("frame %d GRH area % x, sent % x", i, got.grh[20:40], frames[i][:20])
				}
				if got.srcQP != 0x11 && got.srcQP != 0x12 {
					t.Errorf("frame %d srcQP %#x", i, got.srcQP)
				}
			}
			rx.none(t, 0)
		})
	}
	if c := d.Counters(); c.Get(softverbs.TruncatedDrops)+c.Get(softverbs.OpcodeDrops)+c.Get(softverbs.NoGroupDrops) != 0 {
		t.Errorf("counters %+v", c)
	}
}

func bytesEqual(a, b []byte) bool { return string(a) == string(b) }

// rawSender sends complete IPv4 packets on lo (IP_HDRINCL).
type rawSender struct{ fd int }

func newRawSender(t *testing.T) *rawSender {
	t.Helper()
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_RAW, unix.IPPROTO_RAW)
	if err != nil {
		testenv.Require(t, "no raw socket: %v", err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	lo, err := net.InterfaceByName("lo")
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.SetsockoptIPMreqn(fd, unix.IPPROTO_IP, unix.IP_MULTICAST_IF, &unix.IPMreqn{Ifindex: int32(lo.Index)}); err != nil {
		t.Fatal(err)
	}
	return &rawSender{fd: fd}
}

func (s *rawSender) send(t *testing.T, pkt []byte) {
	t.Helper()
	dst := wire.IPv4(pkt).Dst().As4()
	if err := unix.Sendto(s.fd, pkt, 0, &unix.SockaddrInet4{Addr: dst}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Millisecond)
}
