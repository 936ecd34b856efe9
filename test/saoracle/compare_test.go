package saoracle

import (
	"fmt"

	"github.com/softrdma/softrdma/ib/mad"
)

// diffKey names a documented difference: a case and a field.
type diffKey struct{ name, field string }

// documented lists where softsm answers otherwise than OpenSM 3.3.23, and
// why (docs/infiniband.md lists them too). A
// difference not in this table fails the test, and so does an entry that
// no longer differs.
var documented = map[diffKey]string{
	{"cpi-get", "CPI.CapabilityMask"}:     capMask,
	{"cpi-get-v1", "CPI.CapabilityMask"}:  capMask,
	{"cpi-get", "CPI.CapabilityMask2"}:    capMask2,
	{"cpi-get-v1", "CPI.CapabilityMask2"}: capMask2,

	{"get-proxy-member-trusted", "Reserved(49 bits 6:0)"}: proxyBit0,
	{"get-proxy-joined-trusted", "Reserved(49 bits 6:0)"}: proxyBit0,
	{"get-proxy-joined-trusted", "ProxyJoin"}:             proxyBit7,
	{"get-proxy-created-untrusted", "ProxyJoin"}:          proxyBit7,

	{"pr-dgid-only", "PR.SGID"}: noSource,
	{"pr-dgid-only", "PR.MTU"}:  noSource,

	{"mcmr-class-version-1", "*"}: "umad2sim hands OpenSM an SA MAD of class version 1, which the kernel's MAD layer " +
		"drops on a real fabric (OpenSM's agent registers class version 2), and OpenSM answers it as version 2; " +
		"softsm answers 0x0004 (bad class version, IBA 13.4.7)",
}

// Reasons shared by several entries of documented.
const (
	noSource = "a PathRecord Get with no source answers the first path of the SA's port table: OpenSM's " +
		"begins with the SM's own HCA (GUID 0x200000 under ibsim, MTU 1024), softsm's SM has no end port, " +
		"so its first is port A (MTU 2048)"
	capMask = "softsm serves MCMemberRecord and ClassPortInfo only: it sets IsUDMulticastSupported (0x0200) " +
		"and not OpenSM's IsSubnGetSetNoticeSupported (0x0002; no Notice/InformInfo), IsMultiPathSupported " +
		"(0x0400; no MultiPathRecord/TraceRecord) or IsPortInfoCapMaskMatchSupported (0x2000; no PortInfoRecord)"
	capMask2 = "softsm sets IsSendOnlyFullMemberSupported (0x1000) only; OpenSM's other bits (0xA5E8: " +
		"MulticastTop, AliasGUIDs, FullPortInfoRecord, ExtendedSpeeds, MulticastServiceRecords, " +
		"PortInfoCapMask2Match, LinkWidth2x, LinkSpeedHDR) name records and link features softsm's SA does not have"
	proxyBit0 = "OpenSM 3.3.23 keeps a member's ProxyJoin in a C bitfield that GCC on x86 puts at bit 0 of byte 49 " +
		"of the records it answers later; softsm puts it at bit 7, where IBA and the kernel have it"
	proxyBit7 = "bit 7 of byte 49 in OpenSM's later records is the creating request's (OpenSM answers its copy " +
		"of that request), whatever the member's ProxyJoin; softsm's bit 7 is the member's ProxyJoin (IBA), " +
		"0 in an untrusted record"
)

// field is one compared value.
type field struct {
	name      string
	osm, soft string
}

func (d field) String() string { return fmt.Sprintf("%s: OpenSM %s, softsm %s", d.name, d.osm, d.soft) }

// result is the comparison of one case's answers.
type result struct {
	name    string
	matched int
	fields  int
	diffs   []field
	osmDesc string
	// rmppNotCarried: OpenSM's answer came unsegmented (see unsegmented).
	rmppNotCarried bool
}

func (r *result) summary() string {
	s := fmt.Sprintf("%-30s %-36s %3d/%3d fields match", r.name, r.osmDesc, r.matched, r.fields)
	if r.rmppNotCarried {
		s += " (first 256 bytes: ibsim has no RMPP)"
	}
	return s
}

func (r *result) cmp(name string, osm, soft any) {
	r.fields++
	o, s := fmt.Sprintf("%#x", osm), fmt.Sprintf("%#x", soft)
	if _, ok := osm.(bool); ok {
		o, s = fmt.Sprint(osm), fmt.Sprint(soft)
	}
	if o == s {
		r.matched++
		return
	}
	r.diffs = append(r.diffs, field{name: name, osm: o, soft: s})
}

// describe names an answer: method, status, segments.
func describe(ms []mad.MAD) string {
	if len(ms) == 0 {
		return "no answer"
	}
	m := ms[0]
	s := fmt.Sprintf("method %#x status %#04x", m.Method(), m.Status())
	if len(ms) > 1 {
		s += fmt.Sprintf(" %d segments", len(ms))
	}
	return s
}

// compare compares OpenSM's answers (want) with softsm's (got) field by
// field. TIDs are compared in their low 32 bits (the MAD layer's agent
// owns the high ones); GIDs, GUIDs and the subnet prefix are the same on
// both subnets by construction (softsm's ports take ibsim's GUIDs), and
// MLIDs are allocated alike (lowest free from 0xC000), so they are
// compared as they are.
func compare(name string, want, got []mad.MAD) *result {
	r := &result{name: name, osmDesc: describe(want)}
	r.cmp("answered", len(want) > 0, len(got) > 0)
	if len(want) == 0 || len(got) == 0 {
		return r
	}
	w, g := want[0], got[0]
	if unsegmented(w) {
		// ibsim does not carry RMPP (see unsegmented): the first 256
		// bytes of OpenSM's answer against softsm's first segment, its
		// RMPP header (the kernel's part) and the records beyond the
		// first segment left out.
		r.rmppNotCarried = true
		header(r, "", w, g)
		wd := w.SAData()
		gd := tableData(got)
		n := 0
		for n+mad.MCMemberRecordStride <= len(wd) && !mad.MCMemberRecord(wd[n:]).MGID().IsZero() {
			n += mad.MCMemberRecordStride
		}
		if len(gd) > len(wd) {
			gd = gd[:len(wd)]
		}
		r.cmp("records(first segment)", n/mad.MCMemberRecordStride, min(len(gd), len(wd))/mad.MCMemberRecordStride)
		for i := 0; i+mad.MCMemberRecordStride <= n && i+mad.MCMemberRecordStride <= len(gd); i += mad.MCMemberRecordStride {
			mcMember(r, fmt.Sprintf("rec%d.", i/mad.MCMemberRecordStride), wd[i:i+mad.MCMemberRecordStride], gd[i:i+mad.MCMemberRecordStride])
		}
		return r
	}
	r.cmp("segments", len(want), len(got))
	for i := 0; i < len(want) && i < len(got); i++ {
		p := ""
		if len(want) > 1 || len(got) > 1 {
			p = fmt.Sprintf("seg%d.", i+1)
		}
		header(r, p, want[i], got[i])
	}
	if w.Method() != g.Method() || w.AttrID() != g.AttrID() {
		return r
	}
	switch {
	case w.AttrID() == mad.AttrClassPortInfo && w.Status() == 0 && g.Status() == 0:
		classPortInfo(r, w.ClassPortInfo(), g.ClassPortInfo())
	case w.AttrID() == mad.AttrMCMemberRecord && w.Method() == mad.MethodGetTableResp:
		wd, gd := tableData(want), tableData(got)
		stride := int(w.AttrOffset()) * 8
		if stride == 0 {
			stride = mad.MCMemberRecordStride
		}
		wn, gn := len(wd)/stride, len(gd)/stride
		r.cmp("records", wn, gn)
		for i := 0; i < wn && i < gn; i++ {
			mcMember(r, fmt.Sprintf("rec%d.", i), wd[i*stride:(i+1)*stride], gd[i*stride:(i+1)*stride])
		}
	case w.AttrID() == mad.AttrMCMemberRecord:
		mcMember(r, "", w.SAData()[:mad.MCMemberRecordStride], g.SAData()[:mad.MCMemberRecordStride])
	case w.AttrID() == mad.AttrPathRecord && w.Status() == 0 && g.Status() == 0:
		pathRecord(r, w.PathRecord(), g.PathRecord())
	}
	return r
}

// header compares the common MAD header, the RMPP header and the SA
// header.
func header(r *result, p string, w, g mad.MAD) {
	r.cmp(p+"BaseVersion", w.BaseVersion(), g.BaseVersion())
	r.cmp(p+"MgmtClass", w.MgmtClass(), g.MgmtClass())
	r.cmp(p+"ClassVersion", w.ClassVersion(), g.ClassVersion())
	r.cmp(p+"Method", w.Method(), g.Method())
	r.cmp(p+"Status", w.Status(), g.Status())
	r.cmp(p+"ClassSpecific", w.ClassSpecific(), g.ClassSpecific())
	r.cmp(p+"TID(low 32)", tidLow(w), tidLow(g))
	r.cmp(p+"AttrID", w.AttrID(), g.AttrID())
	r.cmp(p+"Reserved(18)", w[18:20], g[18:20])
	r.cmp(p+"AttrMod", w.AttrMod(), g.AttrMod())
	if r.rmppNotCarried {
		r.cmp(p+"RMPPFlags.Active", w.RMPPFlags()&mad.RMPPFlagActive, g.RMPPFlags()&mad.RMPPFlagActive)
	} else {
		r.cmp(p+"RMPPVersion", w.RMPPVersion(), g.RMPPVersion())
		r.cmp(p+"RMPPType", w.RMPPType(), g.RMPPType())
		r.cmp(p+"RRespTime", w.RMPPRespTime(), g.RMPPRespTime())
		r.cmp(p+"RMPPFlags", w.RMPPFlags(), g.RMPPFlags())
		r.cmp(p+"RMPPStatus", w.RMPPStatus(), g.RMPPStatus())
		r.cmp(p+"SegmentNumber", w.SegmentNumber(), g.SegmentNumber())
		r.cmp(p+"PayloadLength", w.PayloadLength(), g.PayloadLength())
	}
	r.cmp(p+"SMKey", w.SMKey(), g.SMKey())
	r.cmp(p+"AttrOffset", w.AttrOffset(), g.AttrOffset())
	r.cmp(p+"Reserved(46)", w[46:48], g[46:48])
	r.cmp(p+"CompMask", w.CompMask(), g.CompMask())
}

// classPortInfo compares every ClassPortInfo field.
func classPortInfo(r *result, w, g mad.ClassPortInfo) {
	r.cmp("CPI.BaseVersion", w.BaseVersion(), g.BaseVersion())
	r.cmp("CPI.ClassVersion", w.ClassVersion(), g.ClassVersion())
	r.cmp("CPI.CapabilityMask", w.CapabilityMask(), g.CapabilityMask())
	r.cmp("CPI.CapabilityMask2", w.CapabilityMask2(), g.CapabilityMask2())
	r.cmp("CPI.RespTimeValue", w.RespTimeValue(), g.RespTimeValue())
	r.cmp("CPI.RedirectGID", w.RedirectGID(), g.RedirectGID())
	r.cmp("CPI.RedirectTCSLFL", w.RedirectTCSLFL(), g.RedirectTCSLFL())
	r.cmp("CPI.RedirectLID", w.RedirectLID(), g.RedirectLID())
	r.cmp("CPI.RedirectPKey", w.RedirectPKey(), g.RedirectPKey())
	r.cmp("CPI.RedirectQPReserved", w[32], g[32])
	r.cmp("CPI.RedirectQP", w.RedirectQP(), g.RedirectQP())
	r.cmp("CPI.RedirectQKey", w.RedirectQKey(), g.RedirectQKey())
	r.cmp("CPI.TrapGID", w.TrapGID(), g.TrapGID())
	r.cmp("CPI.TrapTCSLFL", w.TrapTCSLFL(), g.TrapTCSLFL())
	r.cmp("CPI.TrapLID", w.TrapLID(), g.TrapLID())
	r.cmp("CPI.TrapPKey", w.TrapPKey(), g.TrapPKey())
	r.cmp("CPI.TrapHopLimit", w.TrapHopLimit(), g.TrapHopLimit())
	r.cmp("CPI.TrapQP", w.TrapQP(), g.TrapQP())
	r.cmp("CPI.TrapQKey", w.TrapQKey(), g.TrapQKey())
}

// mcMember compares every MCMemberRecord field, the byte of ProxyJoin
// bit by bit (bit 7, the kernel's and the spec's ProxyJoin, and the 7
// reserved bits), the reserved bytes and the padding to 56 bytes.
func mcMember(r *result, p string, wb, gb []byte) {
	w, g := mad.MCMemberRecord(wb).Fields(), mad.MCMemberRecord(gb).Fields()
	r.cmp(p+"MGID", w.MGID, g.MGID)
	r.cmp(p+"PortGID", w.PortGID, g.PortGID)
	r.cmp(p+"QKey", w.QKey, g.QKey)
	r.cmp(p+"MLID", w.MLID, g.MLID)
	r.cmp(p+"MTUSelector", w.MTUSelector, g.MTUSelector)
	r.cmp(p+"MTU", w.MTU, g.MTU)
	r.cmp(p+"TClass", w.TClass, g.TClass)
	r.cmp(p+"PKey", w.PKey, g.PKey)
	r.cmp(p+"RateSelector", w.RateSelector, g.RateSelector)
	r.cmp(p+"Rate", w.Rate, g.Rate)
	r.cmp(p+"PacketLifeTimeSelector", w.PacketLifeTimeSelector, g.PacketLifeTimeSelector)
	r.cmp(p+"PacketLifeTime", w.PacketLifeTime, g.PacketLifeTime)
	r.cmp(p+"SL", w.SL, g.SL)
	r.cmp(p+"FlowLabel", w.FlowLabel, g.FlowLabel)
	r.cmp(p+"HopLimit", w.HopLimit, g.HopLimit)
	r.cmp(p+"Scope", w.Scope, g.Scope)
	r.cmp(p+"JoinState", w.JoinState, g.JoinState)
	r.cmp(p+"ProxyJoin", w.ProxyJoin, g.ProxyJoin)
	e := mad.MCMemberRecordEchoOffset
	r.cmp(p+"Reserved(49 bits 6:0)", wb[e]&0x7f, gb[e]&0x7f)
	r.cmp(p+"Reserved(50)", wb[e+1:e+3], gb[e+1:e+3])
	r.cmp(p+"Padding(52)", wb[mad.MCMemberRecordLen:mad.MCMemberRecordStride], gb[mad.MCMemberRecordLen:mad.MCMemberRecordStride])
}

// tableData concatenates the SA data of an RMPP answer's segments, cut to
// the transfer's length (the first segment's PayloadLength less the SA
// header of each segment, as the kernel reassembles it).
func tableData(segs []mad.MAD) []byte {
	var d []byte
	for _, s := range segs {
		d = append(d, s.SAData()...)
	}
	if len(segs) > 0 && segs[0].RMPPFlags()&mad.RMPPFlagActive != 0 {
		total := int(segs[0].PayloadLength()) - len(segs)*(mad.SAHeaderEnd-mad.HeaderLen-mad.RMPPHeaderLen)
		if segs[0].PayloadLength() == 0 {
			total = 0
		}
		if total >= 0 && total < len(d) {
			d = d[:total]
		}
	}
	return d
}

// pathRecord compares every field of a PathRecord. LIDs are each SM's own
// (OpenSM's sweep and softsm's allocator number ports differently): a
// unicast LID is compared as non-zero, a multicast one (an MLID, allocated
// alike) as it is.
func pathRecord(r *result, w, g mad.PathRecord) {
	lid := func(l uint16) any {
		if l >= 0xC000 {
			return l
		}
		return l != 0
	}
	r.cmp("PR.ServiceID", w.ServiceID(), g.ServiceID())
	r.cmp("PR.DGID", w.DGID(), g.DGID())
	r.cmp("PR.SGID", w.SGID(), g.SGID())
	r.cmp("PR.DLID", lid(w.DLID()), lid(g.DLID()))
	r.cmp("PR.SLID", lid(w.SLID()), lid(g.SLID()))
	r.cmp("PR.RawTraffic", w.RawTraffic(), g.RawTraffic())
	r.cmp("PR.Reserved(44 bits 30:28)", []byte(w)[44]&0x70, []byte(g)[44]&0x70)
	r.cmp("PR.FlowLabel", w.FlowLabel(), g.FlowLabel())
	r.cmp("PR.HopLimit", w.HopLimit(), g.HopLimit())
	r.cmp("PR.TClass", w.TClass(), g.TClass())
	r.cmp("PR.Reversible", w.Reversible(), g.Reversible())
	r.cmp("PR.NumbPath", w.NumbPath(), g.NumbPath())
	r.cmp("PR.PKey", w.PKey(), g.PKey())
	r.cmp("PR.QoSClass", w.QoSClass(), g.QoSClass())
	r.cmp("PR.SL", w.SL(), g.SL())
	r.cmp("PR.MTUSelector", w.MTUSelector(), g.MTUSelector())
	r.cmp("PR.MTU", w.MTU(), g.MTU())
	r.cmp("PR.RateSelector", w.RateSelector(), g.RateSelector())
	r.cmp("PR.Rate", w.Rate(), g.Rate())
	r.cmp("PR.PacketLifeTimeSelector", w.PacketLifeTimeSelector(), g.PacketLifeTimeSelector())
	r.cmp("PR.PacketLifeTime", w.PacketLifeTime(), g.PacketLifeTime())
	r.cmp("PR.Preference", w.Preference(), g.Preference())
	r.cmp("PR.Reserved(58)", []byte(w)[58:64], []byte(g)[58:64])
}
