package wire

import (
	"net/netip"
	"testing"
)

func TestGIDMapping(t *testing.T) {
	a := netip.MustParseAddr
	g := func(s string) GID { return a(s).As16() }
	for _, tc := range []struct {
		name string
		got  GID
		want GID
	}{
		{"RoCEv2 224.1.2.3", RoCEv2MGID(a("224.1.2.3")), GID{10: 0xff, 11: 0xff, 12: 0xe0, 13: 0x01, 14: 0x02, 15: 0x03}},
		{"RoCEv2 IPv6 verbatim", RoCEv2MGID(a("ff0e::1:2")), g("ff0e::1:2")},
		{"GIDFromAddr IPv4", GIDFromAddr(a("10.99.0.11")), g("::ffff:10.99.0.11")},
		{"IB PS_UDP 230.1.2.3", IBMGID(a("230.1.2.3"), 0xffff, 2, true), g("ff12:4001:ffff::601:203")},
		{"IB PS_IPOIB 230.1.2.3", IBMGID(a("230.1.2.3"), 0xffff, 2, false), g("ff12:401b:ffff::601:203")},
		{"IB IPv4-mapped input", IBMGID(a("::ffff:230.1.2.3"), 0xffff, 2, false), g("ff12:401b:ffff::601:203")},
		{"IB pkey and scope", IBMGID(a("239.255.0.1"), 0x8001, 5, false), g("ff15:401b:8001::fff:1")},
		{"SA-assigned verbatim", IBMGID(a("ff12:a01b::1234:5678"), 0xffff, 2, true), g("ff12:a01b::1234:5678")},
		{"SA-assigned other scope", IBMGID(a("ff15:a01b:1::9"), 0xffff, 2, false), g("ff15:a01b:1::9")},
		{"zero Addr", IBMGID(netip.Addr{}, 0xffff, 2, true), GID{}},
		{"0.0.0.0", IBMGID(a("0.0.0.0"), 0xffff, 2, false), GID{}},
		{"::", IBMGID(a("::"), 0xffff, 2, false), GID{}},
		{"IPv6 IPoIB", IBMGID(a("ff0e:1:2:3:4:5:6:7"), 0xffff, 2, false), g("ff12:601b:ffff:3:4:5:6:7")},
		{"IPv6 PS_UDP", IBMGID(a("ff0e:1:2:3:4:5:6:7"), 0xffff, 2, true), g("ff12:6001:ffff:3:4:5:6:7")},
	} {
		if tc.got != tc.want {
			t.Errorf("%s: got %v, want %v", tc.name, tc.got, tc.want)
		}
	}
}

func TestGIDPredicates(t *testing.T) {
	for _, tc := range []struct {
		s                       string
		mcast, v4mapped, saMGID bool
		addr                    string
	}{
		{"::ffff:224.1.2.3", true, true, false, "224.1.2.3"},
		{"::ffff:239.255.255.255", true, true, false, "239.255.255.255"},
		{"::ffff:10.0.0.1", false, true, false, "10.0.0.1"},
		{"::ffff:240.0.0.1", false, true, false, "240.0.0.1"},
		{"ff12:401b:ffff::601:203", true, false, false, "ff12:401b:ffff::601:203"},
		{"ff12:a01b::1", true, false, true, "ff12:a01b::1"},
		{"fe80::1", false, false, false, "fe80::1"},
		{"::", false, false, false, "::"},
	} {
		g, err := ParseGID(tc.s)
		if err != nil {
			t.Fatalf("ParseGID(%q): %v", tc.s, err)
		}
		if g.String() != tc.s {
			t.Errorf("String() = %q, want %q", g.String(), tc.s)
		}
		if g.IsMulticast() != tc.mcast || g.IsV4Mapped() != tc.v4mapped || IsSAAssignedMGID(g) != tc.saMGID {
			t.Errorf("%s: multicast %v v4mapped %v sa %v", tc.s, g.IsMulticast(), g.IsV4Mapped(), IsSAAssignedMGID(g))
		}
		if g.Addr().String() != tc.addr {
			t.Errorf("%s: Addr %v, want %s", tc.s, g.Addr(), tc.addr)
		}
		if g.IsZero() != (tc.s == "::") {
			t.Errorf("%s: IsZero %v", tc.s, g.IsZero())
		}
	}
	for _, bad := range []string{"1.2.3.4", "fe80::1%eth0", "nonsense", ""} {
		if _, err := ParseGID(bad); err == nil {
			t.Errorf("ParseGID(%q) accepted", bad)
		}
	}
}
