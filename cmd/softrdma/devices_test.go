package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/softrdma/softrdma/introspect"
)

// TestPrintIBDevice: an InfiniBand port's view lists its QPs (with their
// MLIDs, no UDP source port) and its SA memberships in use, like an rxe
// device's.
func TestPrintIBDevice(t *testing.T) {
	d := introspect.Device{
		Name: "softib0", Kind: "ib",
		Usage: introspect.Usage{QPs: 1, McastGroups: 1, McastAttachments: 1, SAMemberships: 1},
		Ports: []introspect.Port{{Port: 1, State: "PORT_ACTIVE", StateNum: 4, LID: 2, SMLID: 1, LinkLayer: "InfiniBand"}},
		QPs: []introspect.QP{{QPN: 0x2, Type: "UD", State: "RTS", QKey: 0x01234567, Port: 1,
			Groups: []string{"ff12:4001:ffff::601:203 (mlid 0xc001)"}, CMID: 3}},
	}
	var b bytes.Buffer
	printDevice(&b, d, true)
	out := b.String()
	for _, want := range []string{"qps:", "qpn 0x000002", "ff12:4001:ffff::601:203 (mlid 0xc001)", "cm_id 3", "1 SA memberships"} {
		if !strings.Contains(out, want) {
			t.Errorf("no %q in\n%s", want, out)
		}
	}
	if strings.Contains(out, "udp_sport") {
		t.Errorf("UDP source port on an IB QP:\n%s", out)
	}
}
