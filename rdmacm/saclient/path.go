package saclient

import (
	"fmt"
	"syscall"

	"github.com/softrdma/softrdma/ib/mad"
)

// QueryPath sends SubnAdmGet(PathRecord) with the record req and component
// mask (the kernel's ib_sa_path_rec_get, as cma_query_ib_route asks it)
// and returns a copy of the SA's record. It waits as GetTable does: a
// non-zero SA status (no path) gives an error wrapping EINVAL, as the
// kernel's SA client reports one; a silent SA ETIMEDOUT; a closed agent
// ENODEV.
func (e *Agent) QueryPath(req mad.PathRecord, mask uint64) (mad.PathRecord, error) {
	c := e.sa
	tid := c.newTID()
	m := mad.NewSARequest(mad.MethodGet, mad.AttrPathRecord, tid, mask)
	copy(m.PathRecord(), req)
	resp, err := c.roundTrip(tid, mad.AttrPathRecord, m)
	if err != nil {
		return nil, err
	}
	a := mad.MAD(resp.m)
	if len(a) < mad.Len || a.AttrID() != mad.AttrPathRecord {
		return nil, errBadMAD
	}
	if st := a.Status(); st != mad.StatusOK {
		return nil, fmt.Errorf("mcast: SA PathRecord status %#04x: %w", st, syscall.EINVAL)
	}
	return append(mad.PathRecord(nil), a.PathRecord()...), nil
}

// Query sends one SA request of method Get, Set or Delete for the
// attribute attr, with the component mask and record (copied into the SA
// data; at most mad.Len-mad.SAHeaderEnd bytes), and returns a copy of the
// SA's answer MAD (256 bytes) whatever its MAD status, which the caller
// reads: a ClassPortInfo Get, an InformInfo Set (a subscription to the
// SA's Reports, which arrive on the port's QP1 as Report MADs the agent
// does not take), or any record the agent has no method for. It waits as
// QueryPath does: ETIMEDOUT after the retries, ENODEV once the agent is
// closed; another method (GetTable: see GetTable) is refused with EINVAL.
func (e *Agent) Query(method uint8, attr uint16, mask uint64, record []byte) (mad.MAD, error) {
	switch method {
	case mad.MethodGet, mad.MethodSet, mad.MethodDelete:
	default:
		return nil, fmt.Errorf("mcast: SA Query of method %#x: %w", method, syscall.EINVAL)
	}
	if len(record) > mad.Len-mad.SAHeaderEnd {
		return nil, fmt.Errorf("mcast: SA Query record of %d bytes: %w", len(record), syscall.EINVAL)
	}
	c := e.sa
	tid := c.newTID()
	m := mad.NewSARequest(method, attr, tid, mask)
	copy(m.SAData(), record)
	resp, err := c.roundTrip(tid, attr, m)
	if err != nil {
		return nil, err
	}
	return mad.MAD(resp.m), nil
}
