package rxe

import (
	"slices"
	"sync/atomic"
	"time"

	"github.com/softrdma/softrdma/internal/sys/mmsg"
	"github.com/softrdma/softrdma/internal/sys/pollfd"
	"github.com/softrdma/softrdma/provider/softverbs"
)

// A consumer's progress across the device's unicast inputs.
//
// A CQ that a consumer polls in a loop reads the socket of its last
// completion itself (softverbs.Source), so that no goroutine has to wake
// for a datagram. A unicast datagram, though, reaches the kernel's pick
// among every socket of the user on UDP 4791 (the reuseport group, by a
// hash of its addresses and ports): for two processes in a ping-pong, one
// direction or both may always land in the other process, which hands it
// over (forward.go). Its owner then gets it from a hand-over connection,
// and the datagrams it sends may wait on its own unicast socket to be
// handed over the other way: inputs that the CQ's socket is not. Each
// receiver's Source is therefore its own socket plus the device's unicast
// inputs (unicast receive sockets, hand-over connections) that read
// something in the last activeFor: a polling consumer reads those too and
// hands over what it finds, and in a ping-pong no datagram waits for a
// goroutine to wake on a core that two pollers hold (measured: a perftest
// ib_send_lat round trip of 80–460 µs instead of 12–16 µs whenever the
// hash sent a direction through the hand-over). An input that read
// nothing lately costs a consumer nothing, so the membership sockets'
// consumers (multicast only) make no more system calls than before.

// activeFor is how long after an input's last datagram the consumers of
// the device's other inputs read it too.
const activeFor = 100 * time.Millisecond

// epoch is the origin of clock.
var epoch = time.Now()

// clock returns the monotonic time since epoch, at least 1.
func clock() int64 { return int64(time.Since(epoch)) | 1 }

// uinput is one of the device's unicast inputs.
type uinput struct {
	br   *mmsg.Reader
	last atomic.Int64 // clock() when its receiver last handled a batch; 0: never
}

// active reports whether the input read something since now-activeFor.
func (x *uinput) active(now int64) bool {
	l := x.last.Load()
	return l != 0 && now-l < int64(activeFor)
}

// addInputLocked adds x to the device's unicast inputs (d.mu held).
func (d *Device) addInputLocked(x *uinput) {
	var l []*uinput
	if p := d.uinputs.Load(); p != nil {
		l = slices.Clone(*p)
	}
	l = append(l, x)
	d.uinputs.Store(&l)
}

// removeInputLocked removes x from the device's unicast inputs (d.mu
// held).
func (d *Device) removeInputLocked(x *uinput) {
	p := d.uinputs.Load()
	if p == nil {
		return
	}
	l := slices.DeleteFunc(slices.Clone(*p), func(y *uinput) bool { return y == x })
	d.uinputs.Store(&l)
}

// devInput is the softverbs.Input of one receiver's Source: its own
// socket (or connection) and the device's active unicast inputs.
type devInput struct {
	own *mmsg.Reader
	d   *Device
}

// newSource returns the Source of a receiver reading br.
func newSource(d *Device, br *mmsg.Reader) *softverbs.Source {
	return softverbs.NewSource(&devInput{own: br, d: d})
}

// others returns the device's unicast inputs.
func (in *devInput) others() []*uinput {
	if p := in.d.uinputs.Load(); p != nil {
		return *p
	}
	return nil
}

// Progress reads its socket, then the active unicast inputs, without
// blocking (softverbs.Input). It allocates nothing.
func (in *devInput) Progress() {
	in.own.Progress()
	in.readOthers(true)
}

// ReadNow is Progress without the leases (softverbs.Input).
func (in *devInput) ReadNow() {
	in.own.ReadNow()
	in.readOthers(false)
}

// readOthers reads the active unicast inputs other than its own, with
// their leases (Progress) or without (ReadNow).
func (in *devInput) readOthers(lease bool) {
	l := in.others()
	if len(l) == 0 {
		return
	}
	now := clock()
	for _, x := range l {
		switch {
		case x.br == in.own || !x.active(now):
		case lease:
			x.br.Progress()
		default:
			x.br.ReadNow()
		}
	}
}

// EndLease gives every input back to its goroutine (softverbs.Input).
func (in *devInput) EndLease() {
	in.own.EndLease()
	for _, x := range in.others() {
		if x.br != in.own {
			x.br.EndLease()
		}
	}
}

// Wait waits on its own socket; the other inputs go back to their
// goroutines first, whose deliveries ring the consumer's bell (kick)
// (softverbs.Input).
func (in *devInput) Wait(kick *pollfd.Kick, timeout time.Duration, woke func()) (bool, error) {
	for _, x := range in.others() {
		if x.br != in.own {
			x.br.EndLease()
		}
	}
	kicked, err := in.own.Wait(kick, timeout, woke)
	if err == nil {
		in.readOthers(false)
	}
	return kicked, err
}
