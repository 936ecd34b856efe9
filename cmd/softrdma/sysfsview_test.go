package main

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/softrdma/softrdma/provider/rxe"
	"github.com/softrdma/softrdma/verbs"
)

// TestSysfsViewFormats checks the kernel's formats: a GUID as sysfs and
// ibv_devinfo print it, a GID as %pI6, the GID types' names.
func TestSysfsViewFormats(t *testing.T) {
	if got := guidString(0x020000fffe000001); got != "0200:00ff:fe00:0001" {
		t.Errorf("guidString = %q", got)
	}
	var g verbs.GID
	a := netip.MustParseAddr("::ffff:127.0.0.1").As16()
	copy(g[:], a[:])
	if got := gidString(g); got != "0000:0000:0000:0000:0000:ffff:7f00:0001" {
		t.Errorf("gidString = %q", got)
	}
	if gidTypeString(verbs.GIDTypeRoCEv2) != "RoCE v2" || gidTypeString(verbs.GIDTypeRoCEv1) != "IB/RoCE v1" {
		t.Error("gidTypeString")
	}
}

// TestSysfsViewContents builds the view (without mounting it, as any
// user) and checks rxe_lo's files against the device's own attributes.
func TestSysfsViewContents(t *testing.T) {
	v, err := buildView()
	if err != nil {
		t.Fatal(err)
	}
	files := map[string]string{}
	for _, f := range v.files {
		if f.link != "" {
			files[f.path] = "-> " + f.link
		} else {
			files[f.path] = strings.TrimSuffix(f.data, "\n")
		}
	}
	h := verbs.NewHost()
	defer h.Close()
	d, err := rxe.On(h).ForName("lo")
	if err != nil {
		t.Fatal(err)
	}
	ctx, err := d.Verbs().Open()
	if err != nil {
		t.Fatal(err)
	}
	defer ctx.Close()
	gid0, err := ctx.QueryGID(1, 0)
	if err != nil {
		t.Fatal(err)
	}
	port, err := ctx.QueryPort(1)
	if err != nil {
		t.Fatal(err)
	}
	p := "infiniband/rxe_lo/ports/1/"
	want := map[string]string{
		"infiniband/rxe_lo/node_guid":     guidString(ctx.QueryDevice().NodeGUID),
		"infiniband/rxe_lo/node_type":     "1: CA",
		"infiniband/rxe_lo/parent":        "lo",
		"infiniband/rxe_lo/device/net/lo": "-> /sys/class/net/lo",
		p + "gids/0":                      gidString(gid0),
		p + "gid_attrs/ndevs/0":           "lo",
		p + "gid_attrs/types/0":           "RoCE v2",
		p + "state":                       "4: ACTIVE",
		p + "phys_state":                  "5: LinkUp",
		p + "link_layer":                  "Ethernet",
		p + "lid":                         "0x0",
		p + "cap_mask":                    "0x04010000",
		p + "pkeys/0":                     "0xffff",
		"infiniband_verbs/abi_version":    "6",
	}
	for k, w := range want {
		if got, ok := files[k]; !ok || got != w {
			t.Errorf("%s = %q (present %v), want %q", k, got, ok, w)
		}
	}
	uverbs := false
	for k, c := range files {
		uverbs = uverbs || strings.HasPrefix(k, "infiniband_verbs/uverbs") && strings.HasSuffix(k, "/ibdev") && c == "rxe_lo"
	}
	if !uverbs {
		t.Error("no infiniband_verbs/uverbsN/ibdev names rxe_lo")
	}
	n := 0
	for k := range files {
		if strings.HasPrefix(k, p+"gids/") {
			n++
		}
	}
	if n != port.GIDTblLen {
		t.Errorf("%d gids files, ibv_query_port's gid_tbl_len is %d", n, port.GIDTblLen)
	}
}
