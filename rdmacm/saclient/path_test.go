package saclient

import (
	"errors"
	"syscall"
	"testing"
	"time"

	"github.com/softrdma/softrdma/ib/fabric"
	"github.com/softrdma/softrdma/ib/mad"
	"github.com/softrdma/softrdma/ib/sa"
)

// TestQueryPath asks the SA for the path to the port itself (LID 7), then
// for a GID no port has (EINVAL), then of a silent SA (ETIMEDOUT).
func TestQueryPath(t *testing.T) {
	p := newFakePort(t, Config{Timeout: 50 * time.Millisecond, Retries: 1})
	p.mu.Lock()
	p.sa.AddPort(sa.Port{GUID: testGUID, LID: 7, MTU: fabric.PortMTU, Rate: fabric.PortRate})
	p.mu.Unlock()
	q := mad.PathRecord(make([]byte, mad.PathRecordLen))
	q.SetSGID(p.PortGID())
	q.SetDGID(p.PortGID())
	q.SetNumbPath(1)
	rec, err := p.e.QueryPath(q, mad.PathCompSGID|mad.PathCompDGID|mad.PathCompNumbPath)
	if err != nil {
		t.Fatal(err)
	}
	if rec.DLID() != 7 || rec.SLID() != 7 || rec.DGID() != p.PortGID() || rec.MTU() != fabric.PortMTU {
		t.Errorf("path % x", []byte(rec))
	}
	q.SetDGID(fabric.PortGID(fabric.DefaultSubnetPrefix, 0x1234))
	if _, err := p.e.QueryPath(q, mad.PathCompSGID|mad.PathCompDGID); !errors.Is(err, syscall.EINVAL) {
		t.Errorf("unknown GID: %v, want EINVAL", err)
	}
	p.silent.Store(true)
	if _, err := p.e.QueryPath(q, mad.PathCompSGID|mad.PathCompDGID); !errors.Is(err, syscall.ETIMEDOUT) {
		t.Errorf("silent SA: %v, want ETIMEDOUT", err)
	}
}

// TestQuery sends a ClassPortInfo Get through Query and gets the SA's
// answer whole; a GetTable is refused before anything is sent, and a
// Get the SA does not answer (attribute 0x0039) times out.
func TestQuery(t *testing.T) {
	p := newFakePort(t, Config{Timeout: 50 * time.Millisecond, Retries: 1})
	a, err := p.e.Query(mad.MethodGet, mad.AttrClassPortInfo, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	if a.Method() != mad.MethodGetResp || a.AttrID() != mad.AttrClassPortInfo || a.Status() != mad.StatusOK ||
		a.ClassPortInfo().ClassVersion() != 2 || a.ClassPortInfo().CapabilityMask()&mad.CapMaskUDMulticast == 0 {
		t.Errorf("ClassPortInfo answer: method %#x attr %#x status %#x, CPI % x", a.Method(), a.AttrID(), a.Status(), []byte(a.ClassPortInfo()))
	}
	if _, err := p.e.Query(mad.MethodGetTable, mad.AttrMCMemberRecord, 0, nil); !errors.Is(err, syscall.EINVAL) {
		t.Errorf("GetTable through Query: %v, want EINVAL", err)
	}
	if _, err := p.e.Query(mad.MethodGet, 0x0039, 0, nil); !errors.Is(err, syscall.ETIMEDOUT) {
		t.Errorf("unanswered attribute: %v, want ETIMEDOUT", err)
	}
}
