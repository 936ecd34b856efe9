// Package all registers every kind of device softrdma has, for a program
// that imports it (as a database/sql program imports its drivers):
//
//	import _ "github.com/softrdma/softrdma/provider/all"
//
// The RoCEv2 software device of every network interface (provider/rxe),
// InfiniBand ports on an emulated subnet (provider/ib) and, in builds with
// the rdmacore tag and cgo, the kernel's RDMA devices and CM through
// rdma-core (provider/rdmacore, provider/rdmacore/cm; empty otherwise).
// The rdmacm and verbs packages name no provider: a program without this
// import (or one of the provider packages) has no devices.
package all

import (
	// The kinds of device, each registering itself from init.
	_ "github.com/softrdma/softrdma/provider/ib"
	_ "github.com/softrdma/softrdma/provider/rdmacore"
	_ "github.com/softrdma/softrdma/provider/rdmacore/cm"
	_ "github.com/softrdma/softrdma/provider/rxe"
)
