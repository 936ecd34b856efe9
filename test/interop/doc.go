// Package interop is the wire-interoperability suite of softrdma: it proves
// that softrdma's software RoCEv2 device and its mckey exchange multicast,
// in both directions, with Linux Soft-RoCE (the kernel's rdma_rxe) and
// rdma-core's own mckey, with the same IGMP behaviour, and that rxe accepts
// our frames (and rejects a corrupted one).
//
// The peers are QEMU guests booted from a Debian image (Debian's
// linux-image-amd64 kernel and a debootstrap --variant=minbase initramfs
// with rdma-core, made by build-image.sh). Each guest's virtio-net NIC is a
// tap device on a Linux bridge (mcast_snooping 1, mcast_querier 1) inside a
// network namespace the suite creates and removes; softrdma's mckey runs in
// a second namespace whose veth is another port of that bridge. Nothing
// leaves the namespaces: no qemu user-mode networking, no host interface.
// Every case captures on the bridge ports (AF_PACKET, gopacket/pcapgo) and
// checks the frames with package wire.
//
// The guests are driven through a 9p shared folder that their init polls
// (see guest/init): the suite writes a shell command, the guest runs it and
// writes its output and exit status back.
//
// The tests run only when SOFTRDMA_INTEROP_IMAGE names a built image
// directory (run.sh builds or reuses one and sets it) and the process is
// root with qemu-system-x86_64 installed; otherwise they skip and say why,
// so `go test ./...` stays fast without the image. With
// SOFTRDMA_INTEROP_REQUIRE=1 (run.sh sets it) a missing prerequisite fails
// instead, except a qemu that cannot start at all, which always skips. On a failure the pcaps, guest consoles and command outputs are
// kept in $SOFTRDMA_ARTIFACTS (or /tmp/softrdma-interop-artifacts).
package interop
