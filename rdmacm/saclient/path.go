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
