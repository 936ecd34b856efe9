package rawudp_test

import (
	"fmt"
	"net"

	"golang.org/x/sys/unix"

	"github.com/softrdma/softrdma/internal/sys/rawudp"
)

// A socket that sends without waking Go's netpoller, and one that reads
// through it; both on loopback.
func ExampleListenUDP() {
	tx, err := rawudp.ListenUDP("udp4", "127.0.0.1:0", nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer tx.Close()
	rx, err := rawudp.ListenUDP("udp4", "127.0.0.1:0", nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer rx.Close()

	if _, err := tx.WriteToUDPAddrPort([]byte("hello"), rx.LocalAddr().(*net.UDPAddr).AddrPort()); err != nil {
		fmt.Println(err)
		return
	}
	// Read parks the goroutine in the netpoller until the socket is
	// readable, then hands the callback the socket's descriptor.
	rc, _ := rx.SyscallConn()
	buf := make([]byte, 64)
	var n int
	rc.Read(func(fd uintptr) bool {
		var rerr error
		n, _, rerr = unix.Recvfrom(int(fd), buf, unix.MSG_DONTWAIT)
		return rerr != unix.EAGAIN
	})
	fmt.Println(string(buf[:n]))
	// Output: hello
}
