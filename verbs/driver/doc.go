// Package driver is the interface between package verbs and the kinds of
// RDMA device, as database/sql/driver is between database/sql and its
// drivers (and rdma-core's driver.h beside verbs.h).
//
// It is implemented by providers: softrdma's software verbs core
// (provider/softverbs, under provider/rxe and provider/ib), the kernel's
// devices through libibverbs (provider/rdmacore), or a test's own kind of
// device. A provider registers its devices' discovery from init
// (Register, RegisterAddrOwner) and hands each device's DeviceOps to
// verbs.Host.RegisterDevice; verbs' handles (Device, Context, PD, MR, CQ,
// QP, AH) call the ops interfaces here. The capabilities a device offers
// the RDMA CM and the SA client (NetdevPort, MADPort, GSIPort) and the
// optional interfaces the tools ask for (Inspector, CounterSource,
// EventSource, Tapper, AsyncEventSource) are here too.
//
// Programs do not use this package: they use verbs (and rdmacm), whose
// names for the plain data types defined here (WC, SendWR, PortAttr…)
// are aliases of these, so a program never imports driver.
package driver
