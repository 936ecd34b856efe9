package ib

import "github.com/softrdma/softrdma/verbs"

// QPInfo is a read-only view of one QP of the port, for operator tools.
type QPInfo struct {
	QPN              uint32
	State            verbs.QPState
	QKey             uint32
	BlockSelfMcastLB bool
	// Groups are the (MGID, MLID) pairs the QP is attached to.
	Groups []Attachment
}

// Attachment is one multicast attachment of a QP.
type Attachment struct {
	MGID verbs.GID
	MLID uint16
}

// QPs returns the port's QPs, by QPN.
func (d *Device) QPs() []QPInfo {
	var out []QPInfo
	for _, q := range d.core.QPs() {
		qi := QPInfo{QPN: q.QPN, State: q.State, QKey: q.QKey, BlockSelfMcastLB: q.BlockSelfMcastLB}
		for _, a := range q.Groups {
			qi.Groups = append(qi.Groups, Attachment{MGID: a.MGID, MLID: a.LID})
		}
		out = append(out, qi)
	}
	return out
}
