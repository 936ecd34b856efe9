package softverbs

import (
	"fmt"
	"syscall"

	"github.com/softrdma/softrdma/verbs"
	"github.com/softrdma/softrdma/verbs/driver"
)

// ahObj is an address handle (struct ibv_ah).
type ahObj struct {
	pd   *pdObj
	attr verbs.AHAttr
	dead bool
}

// CreateAH creates an address handle (ibv_create_ah). On an Ethernet (RoCE)
// port the GRH is mandatory and its SGID index must exist.
func (pd *pdObj) CreateAH(attr *verbs.AHAttr) (driver.AHOps, error) {
	if attr == nil {
		return nil, syscall.EINVAL
	}
	if err := pd.checkAH(attr); err != nil {
		return nil, err
	}
	if err := pd.ctx.dev.take(objAH); err != nil {
		return nil, err
	}
	if err := pd.hold(0, 1); err != nil {
		pd.ctx.dev.put(objAH)
		return nil, err
	}
	return &ahObj{pd: pd, attr: *attr}, nil
}

func (pd *pdObj) checkAH(attr *verbs.AHAttr) error {
	pa, err := pd.ctx.QueryPort(attr.PortNum)
	if err != nil {
		return err
	}
	if pa.LinkLayer == verbs.LinkLayerEthernet && !attr.IsGlobal {
		return fmt.Errorf("RoCE address handle needs a GRH: %w", syscall.EINVAL)
	}
	if attr.IsGlobal {
		if _, err := pd.ctx.queryGIDEntry(attr.PortNum, int(attr.GRH.SGIDIndex)); err != nil {
			return fmt.Errorf("sgid index %d: %w", attr.GRH.SGIDIndex, syscall.EINVAL)
		}
	}
	return nil
}

// Attr returns the attributes the AH was created with.
func (ah *ahObj) Attr() verbs.AHAttr { return ah.attr }

// PD returns the protection domain of the AH.
func (ah *ahObj) PD() *pdObj { return ah.pd }

// Destroy destroys the address handle (ibv_destroy_ah).
func (ah *ahObj) Destroy() error {
	if ah.dead {
		return syscall.EINVAL
	}
	ah.dead = true
	ah.pd.hold(0, -1)
	ah.pd.ctx.dev.put(objAH)
	return nil
}
