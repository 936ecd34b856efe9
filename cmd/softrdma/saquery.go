package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"sort"
	"time"

	"github.com/softrdma/softrdma/ib/fabric"
	"github.com/softrdma/softrdma/ib/mad"
)

func init() {
	commands["saquery"] = command{
		summary: "list the multicast groups and members of an emulated IB subnet's SA (like saquery -g)",
		run:     saquery,
	}
}

// saGroup is one multicast group as saquery prints it.
type saGroup struct {
	MGID      string     `json:"mgid"`
	MLID      uint16     `json:"mlid"`
	QKey      uint32     `json:"qkey"`
	PKey      uint16     `json:"pkey"`
	MTU       uint8      `json:"mtu"`
	Rate      uint8      `json:"rate"`
	SL        uint8      `json:"sl"`
	Scope     uint8      `json:"scope"`
	Members   []saMember `json:"members"`
	mtuField  uint8
	rateField uint8
}

// saMember is one member port of a group.
type saMember struct {
	PortGID   string `json:"port_gid"`
	JoinState uint8  `json:"join_state"`
	ProxyJoin bool   `json:"proxy_join,omitempty"`
}

func saquery(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("saquery", flag.ContinueOnError)
	fs.SetOutput(stderr)
	addr := fs.String("sa", fabric.DefaultSAListen, "the SA's raw MAD address (softsm must run with -sa-listen ADDR)")
	asJSON := fs.Bool("json", false, "print JSON")
	_ = fs.Bool("g", true, "list multicast groups (the only query; accepted for saquery compatibility)")
	timeout := fs.Duration("timeout", 3*time.Second, "how long to wait for the SA")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	groups, err := queryGroups(*addr, *timeout)
	if err != nil {
		fmt.Fprintf(stderr, "softrdma saquery: %v\n", err)
		return 1
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		enc.Encode(groups)
		return 0
	}
	for _, g := range groups {
		fmt.Fprintln(stdout, "MCMemberRecord group dump:")
		fmt.Fprintf(stdout, "\t\tMGID....................%s\n", g.MGID)
		fmt.Fprintf(stdout, "\t\tMlid....................0x%X\n", g.MLID)
		fmt.Fprintf(stdout, "\t\tMtu.....................0x%X\n", g.mtuField)
		fmt.Fprintf(stdout, "\t\tpkey....................0x%X\n", g.PKey)
		fmt.Fprintf(stdout, "\t\tRate....................0x%X\n", g.rateField)
		fmt.Fprintf(stdout, "\t\tSL......................0x%X\n", g.SL)
		fmt.Fprintf(stdout, "\t\tQkey....................0x%08X\n", g.QKey)
		for _, m := range g.Members {
			fmt.Fprintf(stdout, "\t\tPortGid.................%s  JoinState 0x%X\n", m.PortGID, m.JoinState)
		}
	}
	return 0
}

// queryGroups lists the groups (a GetTable without SM_Key: one record per
// group) and their members (a GetTable with the default SM_Key 1, which the
// SA trusts: one record per member).
func queryGroups(addr string, timeout time.Duration) ([]saGroup, error) {
	groups, err := getTable(addr, 0, timeout)
	if err != nil {
		return nil, err
	}
	members, err := getTable(addr, 1, timeout)
	if err != nil {
		return nil, err
	}
	for i := range groups {
		for _, m := range members {
			if m.MGID == groups[i].MGID {
				groups[i].Members = append(groups[i].Members, m.Members...)
			}
		}
	}
	return groups, nil
}

// getTable sends SubnAdmGetTable(MCMemberRecord) to the raw SA port and
// reassembles the RMPP answer, acknowledging its segments.
func getTable(addr string, smKey uint64, timeout time.Duration) ([]saGroup, error) {
	ua, err := net.ResolveUDPAddr("udp", addr)
	if err != nil {
		return nil, err
	}
	conn, err := net.DialUDP("udp", nil, ua)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	tid := rand.Uint64()
	req := mad.NewSARequest(mad.MethodGetTable, mad.AttrMCMemberRecord, tid, 0)
	req.SetSMKey(smKey)
	if _, err := conn.Write(req); err != nil {
		return nil, err
	}
	conn.SetReadDeadline(time.Now().Add(timeout))
	var r mad.Reassembler
	buf := make([]byte, 2048)
	for {
		n, err := conn.Read(buf)
		if err != nil {
			return nil, fmt.Errorf("no answer from the SA at %s (is softsm running with -sa-listen %s?): %w", addr, addr, err)
		}
		m := mad.MAD(append([]byte(nil), buf[:n]...))
		if n != mad.Len || m.TID() != tid {
			continue
		}
		if m.Status() != mad.StatusOK {
			if m.Status() == mad.StatusNoRecords {
				return nil, nil
			}
			return nil, fmt.Errorf("SA status %#04x", m.Status())
		}
		done, data, err := r.Add(m)
		if errors.Is(err, mad.ErrNotRMPP) {
			data, done, err = m.SAData(), true, nil
		}
		if err != nil {
			return nil, err
		}
		// The SA's RMPP sender moves on only with our ACKs, which go out
		// as the kernel's RMPP receiver sends them.
		if a := r.Ack(); a != nil {
			if _, err := conn.Write(a); err != nil {
				return nil, err
			}
		}
		if done {
			return groupsOf(data), nil
		}
	}
}

func groupsOf(data []byte) []saGroup {
	byMGID := map[string]*saGroup{}
	var order []string
	for off := 0; off+mad.MCMemberRecordLen <= len(data); off += mad.MCMemberRecordStride {
		f := mad.MCMemberRecord(data[off : off+mad.MCMemberRecordLen]).Fields()
		key := f.MGID.String()
		g := byMGID[key]
		if g == nil {
			g = &saGroup{MGID: key, MLID: f.MLID, QKey: f.QKey, PKey: f.PKey, MTU: f.MTU, Rate: f.Rate, SL: f.SL, Scope: f.Scope,
				mtuField: f.MTUSelector<<6 | f.MTU, rateField: f.RateSelector<<6 | f.Rate}
			byMGID[key] = g
			order = append(order, key)
		}
		if f.JoinState != 0 {
			g.Members = append(g.Members, saMember{PortGID: f.PortGID.String(), JoinState: f.JoinState, ProxyJoin: f.ProxyJoin})
		}
	}
	out := make([]saGroup, 0, len(order))
	for _, k := range order {
		out = append(out, *byMGID[k])
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].MLID < out[j].MLID })
	return out
}
