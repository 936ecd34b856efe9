package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"net"
	"os"
	"strings"
	"testing"
)

// fakeDNS is a name server on 127.0.0.1 whose answer depends on the first
// label of the name asked: nxdomain (NXDOMAIN), servfail (SERVFAIL),
// refused (REFUSED), nodata (NOERROR, no answer), addr (127.0.0.1 for A, NOERROR without answer for AAAA).
func fakeDNS(t *testing.T) (dial func(ctx context.Context, network, addr string) (net.Conn, error)) {
	t.Helper()
	c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	t.Cleanup(func() { c.Close(); <-done })
	go func() {
		defer close(done)
		buf := make([]byte, 1500)
		for {
			n, from, err := c.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			if resp := fakeAnswer(buf[:n]); resp != nil {
				c.WriteToUDPAddrPort(resp, from)
			}
		}
	}()
	server := c.LocalAddr().String()
	return func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "udp4", server) // UDP only: the answers are short
	}
}

// fakeAnswer builds fakeDNS's answer to query q, or nil for none.
func fakeAnswer(q []byte) []byte {
	if len(q) < 12 {
		return nil
	}
	end := 12 // the question: QNAME labels, QTYPE, QCLASS
	var first string
	for end < len(q) && q[end] != 0 {
		l := int(q[end])
		if first == "" && end+1+l <= len(q) {
			first = string(q[end+1 : end+1+l])
		}
		end += 1 + l
	}
	end += 5
	if end > len(q) {
		return nil
	}
	qtype := binary.BigEndian.Uint16(q[end-4:])
	var rcode byte
	var answer []byte
	switch first {
	case "nxdomain":
		rcode = 3
	case "servfail":
		rcode = 2
	case "refused":
		rcode = 5
	case "addr":
		if qtype == 1 { // A: name at offset 12, IN, TTL 60, 127.0.0.1
			answer = []byte{0xc0, 12, 0, 1, 0, 1, 0, 0, 0, 60, 0, 4, 127, 0, 0, 1}
		}
	}
	r := append([]byte(nil), q[:end]...)
	r[2] |= 0x80        // QR
	r[3] = 0x80 | rcode // RA, RCODE
	binary.BigEndian.PutUint16(r[6:], uint16(len(answer)/16))
	binary.BigEndian.PutUint16(r[8:], 0)
	binary.BigEndian.PutUint16(r[10:], 0) // no additional (EDNS) record
	return append(r, answer...)
}

// TestLookupErrors: a host name that does not resolve prints the line
// rdma-core's mckey prints with gai_strerror's text for the failure, and
// returns its EAI code: NXDOMAIN is EAI_NONAME, NOERROR without an
// address EAI_NODATA, SERVFAIL and a timeout EAI_AGAIN, REFUSED EAI_FAIL.
// The name server is a fake on 127.0.0.1.
func TestLookupErrors(t *testing.T) {
	dial := fakeDNS(t)
	// A name server that does not answer in time, without the wait (Go's
	// resolver would go on asking for resolv.conf's timeout × attempts).
	timeout := func(context.Context, string, string) (net.Conn, error) { return nil, os.ErrDeadlineExceeded }
	tests := []struct {
		host string
		code int
		msg  string
	}{
		{"nxdomain.mckey.test.", eaiNoName, "Name or service not known"},
		{"nodata.mckey.test.", eaiNoData, "No address associated with hostname"},
		{"servfail.mckey.test.", eaiAgain, "Temporary failure in name resolution"},
		{"timeout.mckey.test.", eaiAgain, "Temporary failure in name resolution"},
		{"refused.mckey.test.", eaiFail, "Non-recoverable failure in name resolution"},
		{"", eaiNoName, "Name or service not known"}, // no -m: getaddrinfo(NULL, …)
	}
	for _, tc := range tests {
		t.Run(tc.host, func(t *testing.T) {
			d := dial
			if strings.HasPrefix(tc.host, "timeout.") {
				d = timeout
			}
			var out bytes.Buffer
			m := &mckey{ctx: context.Background(), out: &out, resolver: &net.Resolver{PreferGo: true, Dial: d}, dnsDial: d}
			a, code := m.getAddr(tc.host)
			if a != nil || code != tc.code {
				t.Errorf("getAddr(%q) = %v, %d; want nil, %d", tc.host, a, code, tc.code)
			}
			want := "getaddrinfo failed (" + tc.msg + ") - invalid hostname or IP address\n"
			if out.String() != want {
				t.Errorf("getAddr(%q) printed %q, want %q", tc.host, out.String(), want)
			}
		})
	}
	// A name the fake knows resolves, and prints nothing.
	var out bytes.Buffer
	m := &mckey{ctx: context.Background(), out: &out, resolver: &net.Resolver{PreferGo: true, Dial: dial}, dnsDial: dial}
	a, code := m.getAddr("addr.mckey.test.")
	if code != 0 || a == nil || !strings.HasPrefix(a.String(), "127.0.0.1") || out.Len() != 0 {
		t.Errorf("getAddr(addr.mckey.test.) = %v, %d, printed %q", a, code, out.String())
	}
}
