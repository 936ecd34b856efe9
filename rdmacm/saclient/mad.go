package saclient

import (
	"errors"

	"github.com/softrdma/softrdma/ib/mad"
)

var errBadMAD = errors.New("mcast: malformed SA MAD")

// encodeMCMemberMAD builds an SA MAD carrying an MCMemberRecord.
func encodeMCMemberMAD(method uint8, tid uint64, r *GroupRecord, mask uint64) []byte {
	m := mad.NewSARequest(method, mad.AttrMCMemberRecord, tid, mask)
	m.MCMemberRecord().Encode(r)
	return m
}

// decodeMCMemberMAD reads an SA response: its record and MAD status.
func decodeMCMemberMAD(b []byte) (*GroupRecord, uint16, error) {
	m := mad.MAD(b)
	if len(b) < mad.Len || m.MgmtClass() != mad.ClassSubnAdm || m.AttrID() != mad.AttrMCMemberRecord {
		return nil, 0, errBadMAD
	}
	f := m.MCMemberRecord().Fields()
	return &f, m.Status(), nil
}

// encodeClassPortInfoGet builds SubnAdmGet(ClassPortInfo).
func encodeClassPortInfoGet(tid uint64) []byte {
	return mad.NewSARequest(mad.MethodGet, mad.AttrClassPortInfo, tid, 0)
}

// decodeClassPortInfoSendOnly reads CapabilityMask2 bit 12 (send-only full
// member support) from a ClassPortInfo answer.
func decodeClassPortInfoSendOnly(b []byte) (bool, error) {
	m := mad.MAD(b)
	if len(b) < mad.Len || m.MgmtClass() != mad.ClassSubnAdm || m.AttrID() != mad.AttrClassPortInfo || m.Status() != 0 {
		return false, errBadMAD
	}
	return m.ClassPortInfo().SendOnlyFullMemberSupported(), nil
}
