package main

import (
	"path/filepath"
	"regexp"
	"slices"
	"testing"
)

// TestTimeoutNamesTheInterface: in a network namespace with lo and a veth
// whose route takes multicast, a receiver without -b lands on the veth's
// device, and a sender bound to lo sends to the group. The receiver times
// out and, beside "dropped nothing", names the interface the group's
// datagrams reached (lo), how many, from where, and the -b that would
// have received them. Before, it only asked "is the sender on this device
// (-b)?".
func TestTimeoutNamesTheInterface(t *testing.T) {
	t.Parallel()
	unshare := unshareCmd(t)
	g := randomGroup()
	out := filepath.Join(t.TempDir(), "receiver.out")
	// The receiver's stdout goes to a file (read at the end), its stderr
	// to the shell's; the sender's output is dropped. The shell waits for
	// the receiver's join before it starts the sender, and exits with the
	// receiver's status.
	script := `set -e
ip link set lo up
ip link add veth0 type veth peer name veth1
ip addr add 10.77.0.1/24 dev veth0
ip link set veth0 up
ip link set veth1 up
ip route add 224.0.0.0/4 dev veth0
set +e
"$0" -m "$1" -C 5 --timeout 4s --join-pause 0s >"$2" &
rx=$!
until grep -q '^mckey: joined dgid' "$2"; do
	kill -0 $rx 2>/dev/null || break
	sleep 0.05
done
"$0" -m "$1" -b 127.0.0.1 -s -C 5 --join-pause 0s >/dev/null 2>&1
wait $rx
rc=$?
cat "$2"
exit $rc`
	p := start(t, "mckey", unshare, "-n", "sh", "-c", script, mckeyBin, g, out)
	r := p.finish()
	want := "mckey: device rxe_veth0 (bound to 10.77.0.1) dropped nothing: no datagram for " + g +
		" reached it; 5 reached this host on interface lo (from 127.0.0.1); -b 127.0.0.1 would have received them"
	if !slices.Contains(r.stderr, want) || r.code != timeoutStatus {
		t.Errorf("exit %d, stdout %q, stderr %q, want the line %q", r.code, r.stdout, r.stderr, want)
	}
	landed := regexp.MustCompile(`^mckey: no -b: the route lookup for ` + regexp.QuoteMeta(g) + ` picked interface veth0 \(source 10\.77\.0\.1\); bound to 10\.77\.0\.1:\d+ on device rxe_veth0$`)
	if !slices.ContainsFunc(r.stderr, landed.MatchString) {
		t.Errorf("stderr %q, want a line matching %v", r.stderr, landed)
	}
}
