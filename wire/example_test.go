package wire_test

import (
	"encoding/hex"
	"fmt"
	"net/netip"

	"github.com/softrdma/softrdma/wire"
)

// A RoCEv2 frame captured on the wire (IPv4 header onward): a UD SEND_ONLY
// to multicast group 239.1.1.1, sent with IP ID 0x1b06.
const frameHex = "450000981b064000011163e90a630001ef010101f91f12b7008400006400ffff" +
	"00ffffff00000000012345670000001168656c6c6f2066726f6d20686f737420" +
	"726f63652e70792068656c6c6f2066726f6d20686f737420726f63652e707920" +
	"68656c6c6f2066726f6d20686f737420726f63652e70792068656c6c6f206672" +
	"6f6d20686f737420726f63652e70792068656c6cbbd5a74a"

// Parse a captured RoCEv2 frame, check its ICRC, and recover the IP ID as a
// receiver on a UDP socket (which does not see the IP header) must.
func ExampleParseUD() {
	frame, _ := hex.DecodeString(frameHex)
	ip := wire.IPv4(frame[:wire.IPv4HeaderLen])
	udp := wire.UDP(frame[wire.IPv4HeaderLen : wire.IPv4HeaderLen+wire.UDPHeaderLen])

	var p wire.Packet
	if err := wire.ParseUD(frame[wire.IPv4HeaderLen+wire.UDPHeaderLen:], &p); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("%v → %v port %d\n", ip.Src(), ip.Dst(), udp.DstPort())
	fmt.Printf("opcode %#x pkey %#x destqp %#x psn %d qkey %#x srcqp %#x\n",
		p.BTH.Opcode(), p.BTH.PKey(), p.BTH.DestQP(), p.BTH.PSN(), p.DETH.QKey(), p.DETH.SrcQP())
	fmt.Printf("payload %d bytes: %.16q\n", len(p.Payload), p.Payload)

	crc := wire.ICRCv4(ip, udp, p.Body)
	fmt.Printf("ICRC %#x valid %v\n", crc, crc == p.ICRC)

	hidden := append(wire.IPv4(nil), ip...)
	hidden.SetID(0)
	hidden.SetDF(false)
	id, df, ok := wire.SolveIPv4ID(hidden, udp, p.Body, p.ICRC)
	fmt.Printf("recovered IP ID %#x DF %v ok %v\n", id, df, ok)
	// Output:
	// 10.99.0.1 → 239.1.1.1 port 4791
	// opcode 0x64 pkey 0xffff destqp 0xffffff psn 0 qkey 0x1234567 srcqp 0x11
	// payload 100 bytes: "hello from host "
	// ICRC 0x4aa7d5bb valid true
	// recovered IP ID 0x1b06 DF true ok true
}

// Build a UD SEND_ONLY_WITH_IMMEDIATE to a multicast group and seal it
// with its ICRC, as a sender on a socket with IP_PMTUDISC_DO (IP ID 0, DF).
func ExampleEncodeUD() {
	payload := []byte("hello")
	h := wire.UDHeader{PKey: wire.DefaultPKey, DestQP: wire.MulticastQPN, PSN: 1,
		QKey: 0x01234567, SrcQP: 0x11, HasImm: true, Imm: 0x11}
	data := make([]byte, wire.UDLen(len(payload), h.HasImm))

	ip := make(wire.IPv4, wire.IPv4HeaderLen)
	ip.Encode(wire.IPv4Fields{
		TotalLength: uint16(wire.IPv4HeaderLen + wire.UDPHeaderLen + len(data)),
		DF:          true, TTL: 1, Protocol: wire.IPProtocolUDP,
		Src: netip.MustParseAddr("10.0.0.1"), Dst: netip.MustParseAddr("239.1.1.1"),
	})
	udp := make(wire.UDP, wire.UDPHeaderLen)
	udp.Encode(wire.RxeSrcPort(h.SrcQP), wire.UDPPort, uint16(wire.UDPHeaderLen+len(data)))

	n := wire.EncodeUD(data, &h, payload)
	wire.PutICRC(data[n:], wire.ICRCv4(ip, udp, data[:n]))
	fmt.Printf("% x\n", data)
	// Output:
	// 65 30 ff ff 00 ff ff ff 00 00 00 01 01 23 45 67 00 00 00 11 00 00 00 11 68 65 6c 6c 6f 00 00 00 9a 61 e2 27
}

// A receiver of a flow computes the ICRC prefix of its IP and UDP headers
// once (with IP ID 0 and DF, as a UDP socket cannot see them) and checks
// each datagram of the flow from it, recovering the hidden IP ID.
func ExampleICRCPrefix() {
	frame, _ := hex.DecodeString(frameHex)
	ip := wire.IPv4(frame[:wire.IPv4HeaderLen])
	udp := wire.UDP(frame[wire.IPv4HeaderLen : wire.IPv4HeaderLen+wire.UDPHeaderLen])
	var p wire.Packet
	if err := wire.ParseUD(frame[wire.IPv4HeaderLen+wire.UDPHeaderLen:], &p); err != nil {
		fmt.Println(err)
		return
	}

	flow := append(wire.IPv4(nil), ip...)
	flow.SetID(0)
	flow.SetDF(true)
	prefix := wire.ICRCPrefixV4(flow, udp) // once per flow

	id, df, ok := prefix.SolveIPv4ID(p.Body, p.ICRC) // per datagram
	fmt.Printf("IP ID %#x DF %v ok %v\n", id, df, ok)
	// Output:
	// IP ID 0x1b06 DF true ok true
}
