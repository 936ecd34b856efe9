package rdmacm

import (
	"net"

	"github.com/softrdma/softrdma/verbs"
)

// Every error an exported function of this package returns is a
// *verbs.Error naming the librdmacm call and carrying its errno: the
// functions end with defer wrapErr.

// wrapErr turns a call's named error result into the *verbs.Error of op
// about address a (nil: none).
func wrapErr(err *error, op string, a net.Addr) {
	if *err != nil {
		*err = verbs.OpError(op, addrObj(a), *err)
	}
}

// wrapJoinErr is wrapErr for a call with join attributes.
func wrapJoinErr(err *error, op string, attr *JoinMCAttrEx) {
	if *err != nil {
		var a net.Addr
		if attr != nil {
			a = attr.Addr
		}
		*err = verbs.OpError(op, addrObj(a), *err)
	}
}

// addrObj names an address for an error.
func addrObj(a net.Addr) string {
	if a == nil {
		return ""
	}
	if u, ok := a.(*net.UDPAddr); ok && u == nil {
		return ""
	}
	return a.String()
}
