package rdmacm

import (
	"encoding/binary"
	"fmt"
	"os"
	"strings"
	"syscall"

	"github.com/softrdma/softrdma/verbs"
)

// Option levels of SetOption (rdma_cma.h's RDMA_OPTION_ID, RDMA_OPTION_IB).
const (
	OptionID = 0
	OptionIB = 1
)

// Options of level OptionID, with the C type their value has.
const (
	// OptionIDTOS is RDMA_OPTION_ID_TOS, a uint8: the type of service
	// (RFC 2474) of the id's route. As in the kernel, it does not change
	// the AH of a MULTICAST_JOIN event (its traffic class stays 0 on
	// RoCE, the group's on InfiniBand): put it in the AH attributes
	// (GRH.TrafficClass) before CreateAH to send a group's datagrams with
	// it (the IP TOS byte on RoCEv2, the GRH traffic class on InfiniBand).
	OptionIDTOS = 0
	// OptionIDReuseAddr is RDMA_OPTION_ID_REUSEADDR, a C int: ids that
	// both set it may bind the same port and address (~SO_REUSEADDR).
	OptionIDReuseAddr = 1
	// OptionIDAFOnly is RDMA_OPTION_ID_AFONLY, a C int: an IPv6 id that
	// sets it shares its port with IPv4 ids of the same port
	// (~IPV6_V6ONLY). Unset, IPv4 ids are AFONLY and IPv6 ids take
	// net.ipv6.bindv6only, as in the kernel.
	OptionIDAFOnly = 2
	// OptionIDAckTimeout is RDMA_OPTION_ID_ACK_TIMEOUT, a uint8: the
	// local ACK timeout of a connected QP; UD ids refuse it (EINVAL).
	OptionIDAckTimeout = 3
)

// Options of level OptionIB.
const (
	// OptionIBPath is RDMA_OPTION_IB_PATH, an array of struct
	// ib_path_rec_data (72 bytes each): sets the route of an id whose
	// address is resolved, instead of ResolveRoute, and queues
	// ROUTE_RESOLVED.
	OptionIBPath = 1
)

// sizeofPathRecData is sizeof(struct ib_path_rec_data).
const sizeofPathRecData = 72

// The flags of the path record OptionIBPath takes: IB_PATH_GMP |
// IB_PATH_PRIMARY | IB_PATH_BIDIRECTIONAL.
const ibPathGMPPrimaryBidi = 0x1 | 0x2 | 0x8 | 0x20

// idOption is an option set on an id, kept to be given to the librdmacm
// id the id may become (toKernelLocked).
type idOption struct {
	level, name int
	val         []byte
}

// SetOption sets an option of the id (rdma_set_option). optval is the
// value as C would pass it, its size being optlen: a uint8 or int8 is 1
// byte, an int16/uint16 2, an int, int32 or uint32 4 (a C int), an
// int64/uint64 8, a []byte its length, nil 0. So
// id.SetOption(OptionID, OptionIDTOS, uint8(tos)) and
// id.SetOption(OptionID, OptionIDReuseAddr, 1) port their C lines.
//
// Errors, as the kernel's ucma_set_option gives them: an unknown level or
// option → ENOSYS; a value of the wrong size → EINVAL (a TOS passed as an
// int, too, as in C); REUSEADDR off on an id that is not idle, AFONLY on
// an id past bind, ACK_TIMEOUT on a UD id → EINVAL; IB_PATH not a whole
// number of path records, none of them a primary bidirectional GMP path,
// or on an id whose address is not resolved → EINVAL. A kernel id passes
// the option to librdmacm as is; options set on an id before it becomes a
// kernel id are given to its librdmacm id.
func (id *ID) SetOption(level, optname int, optval any) (err error) {
	defer wrapErr(&err, "rdma_set_option", nil)
	val, err := optBytes(optval)
	if err != nil {
		return err
	}
	id.mu.Lock()
	defer id.mu.Unlock()
	return id.eng.setOptionLocked(id, level, optname, val)
}

// optBytes returns the C bytes of an option value.
func optBytes(v any) ([]byte, error) {
	var b []byte
	switch x := v.(type) {
	case nil:
	case uint8:
		b = []byte{x}
	case int8:
		b = []byte{byte(x)}
	case uint16:
		b = binary.NativeEndian.AppendUint16(nil, x)
	case int16:
		b = binary.NativeEndian.AppendUint16(nil, uint16(x))
	case int:
		if int(int32(x)) != x {
			return nil, fmt.Errorf("option value %d does not fit a C int: %w", x, syscall.EINVAL)
		}
		b = binary.NativeEndian.AppendUint32(nil, uint32(int32(x)))
	case int32:
		b = binary.NativeEndian.AppendUint32(nil, uint32(x))
	case uint32:
		b = binary.NativeEndian.AppendUint32(nil, x)
	case int64:
		b = binary.NativeEndian.AppendUint64(nil, uint64(x))
	case uint64:
		b = binary.NativeEndian.AppendUint64(nil, x)
	case []byte:
		b = append([]byte(nil), x...)
	default:
		return nil, fmt.Errorf("option value of type %T: %w", v, syscall.EINVAL)
	}
	return b, nil
}

// setSoftOptionLocked is the kernel's ucma_set_option_level for a
// softrdma id (id.mu is held).
func (e *softEngine) setSoftOptionLocked(level, optname int, val []byte) error {
	id := e.id
	switch level {
	case OptionID:
		switch optname {
		case OptionIDTOS:
			if len(val) != 1 {
				return fmt.Errorf("TOS is a uint8, not %d bytes: %w", len(val), syscall.EINVAL)
			}
			e.tos, e.tosSet = val[0], true
			return nil
		case OptionIDReuseAddr:
			if len(val) != 4 {
				return fmt.Errorf("REUSEADDR is a C int, not %d bytes: %w", len(val), syscall.EINVAL)
			}
			// rdma_set_reuseaddr: on at any time but while listening,
			// off only on an idle id.
			on := binary.NativeEndian.Uint32(val) != 0
			if !(on && id.state != stateListen) && id.state != stateIdle {
				return fmt.Errorf("REUSEADDR off on a bound id: %w", syscall.EINVAL)
			}
			e.reuse.Store(on)
			return nil
		case OptionIDAFOnly:
			if len(val) != 4 {
				return fmt.Errorf("AFONLY is a C int, not %d bytes: %w", len(val), syscall.EINVAL)
			}
			if id.state != stateIdle && id.state != stateAddrBound {
				return fmt.Errorf("AFONLY after bind: %w", syscall.EINVAL)
			}
			e.afonlySet.Store(true)
			e.afonly.Store(binary.NativeEndian.Uint32(val) != 0)
			return nil
		case OptionIDAckTimeout:
			if len(val) != 1 {
				return fmt.Errorf("ACK_TIMEOUT is a uint8, not %d bytes: %w", len(val), syscall.EINVAL)
			}
			if id.qpType != verbs.QPTypeRC {
				return fmt.Errorf("ACK_TIMEOUT on a %v id: %w", id.ps, syscall.EINVAL)
			}
			e.ackTimeout = val[0]
			return nil
		}
	case OptionIB:
		if optname == OptionIBPath {
			return e.setIBPathLocked(val)
		}
	}
	return fmt.Errorf("option %d of level %d: %w", optname, level, syscall.ENOSYS)
}

// setIBPathLocked is ucma_set_ib_path: the id's route is given, the id is
// ROUTE_RESOLVED and the event is queued at once (id.mu is held).
func (e *softEngine) setIBPathLocked(val []byte) error {
	id := e.id
	if len(val)%sizeofPathRecData != 0 {
		return fmt.Errorf("IB_PATH of %d bytes: %w", len(val), syscall.EINVAL)
	}
	found := false
	for off := 0; off < len(val); off += sizeofPathRecData {
		if binary.NativeEndian.Uint32(val[off:]) == ibPathGMPPrimaryBidi {
			found = true
			break
		}
	}
	if !found || e.dev == nil || id.state != stateAddrResolved {
		return fmt.Errorf("IB_PATH without a primary bidirectional GMP path or on an unresolved id: %w", syscall.EINVAL)
	}
	id.state, e.route = stateRouteResolved, pathsFromIBPathData(val)
	ev := &Event{ID: id, Event: EventRouteResolved}
	ch := id.lockCh()
	ch.enqueueLocked(ev)
	ch.mu.Unlock()
	return nil
}

// defaultAFOnly gives an id that did not set OptionIDAFOnly the kernel's
// default at bind: IPv4 ids are AFONLY, IPv6 ids take
// net.ipv6.bindv6only.
func (e *softEngine) defaultAFOnly(family int) {
	if e.afonlySet.Load() {
		return
	}
	switch family {
	case syscall.AF_INET:
		e.afonly.Store(true)
	case syscall.AF_INET6:
		b, _ := os.ReadFile("/proc/sys/net/ipv6/bindv6only")
		e.afonly.Store(strings.TrimSpace(string(b)) == "1")
	}
}

// TOS returns the type of service set with OptionIDTOS and whether it was
// set (the kernel's id_priv->tos and tos_set). For a kernel id it is what
// was asked of librdmacm.
func (id *ID) TOS() (tos uint8, set bool) {
	id.mu.Lock()
	defer id.mu.Unlock()
	a := id.eng.addrs()
	return a.tos, a.tosSet
}
