package main

// Name lookup failures as getaddrinfo(3) reports them: rdma-core's mckey
// prints gai_strerror(ret) and returns the EAI code.

import (
	"context"
	"encoding/binary"
	"errors"
	"net"
	"strconv"
	"sync/atomic"
)

// glibc's EAI codes of a failed host name lookup.
const (
	eaiNoName = -2 // EAI_NONAME: the name does not exist
	eaiAgain  = -3 // EAI_AGAIN: no answer now (timeout, SERVFAIL)
	eaiFail   = -4 // EAI_FAIL: the name servers refuse or misbehave
	eaiNoData = -5 // EAI_NODATA: the name exists but has no address
)

// gaiStrerror is glibc's gai_strerror for the codes above.
func gaiStrerror(code int) string {
	switch code {
	case eaiNoName:
		return "Name or service not known"
	case eaiAgain:
		return "Temporary failure in name resolution"
	case eaiFail:
		return "Non-recoverable failure in name resolution"
	case eaiNoData:
		return "No address associated with hostname"
	}
	return "Unknown error " + strconv.Itoa(code)
}

func (t *mckey) resolverOrDefault() *net.Resolver {
	if t.resolver != nil {
		return t.resolver
	}
	return net.DefaultResolver
}

// lookupError returns the EAI code of a failed lookup of host: a timeout
// or a temporary failure (SERVFAIL) is EAI_AGAIN; a name not found is
// EAI_NODATA when a name server answered "no error" without an address
// for it (glibc's NO_DATA), else EAI_NONAME; any other failure is
// EAI_FAIL. Go's resolver reports both "no such name" and "no address" as
// not found, so that case is asked again, watching the answers (noData).
func (t *mckey) lookupError(host string, err error) int {
	var de *net.DNSError
	switch {
	case err == nil: // no error and no address
		return eaiNoData
	case !errors.As(err, &de):
		return eaiFail
	case de.IsTimeout || de.IsTemporary:
		return eaiAgain
	case de.IsNotFound:
		if t.noData(host) {
			return eaiNoData
		}
		return eaiNoName
	}
	return eaiFail
}

// noData looks host up again through Go's resolver and reports whether a
// name server answered a query for it with NOERROR and no answer record
// (NODATA: the name exists, it has no address of that type), as glibc's
// res_search remembers when every query failed.
func (t *mckey) noData(host string) bool {
	dial := t.dnsDial
	if dial == nil {
		dial = (&net.Dialer{}).DialContext
	}
	var seen atomic.Bool
	r := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		if uc, ok := c.(*net.UDPConn); ok {
			return &watchedUDP{UDPConn: uc, seen: &seen}, nil // a PacketConn: one message per read
		}
		return &watchedStream{Conn: c, seen: &seen}, nil
	}}
	r.LookupIP(t.ctx, "ip", host)
	return seen.Load()
}

// isNoData reports whether a DNS message is a response with RCODE NOERROR
// and no answer record.
func isNoData(m []byte) bool {
	return len(m) >= 12 && m[2]&0x80 != 0 && m[3]&0x0f == 0 && binary.BigEndian.Uint16(m[6:8]) == 0
}

// watchedUDP is a name server's UDP socket whose answers noData checks.
type watchedUDP struct {
	*net.UDPConn
	seen *atomic.Bool
}

// Read reads one DNS message and notes a NODATA answer.
func (c *watchedUDP) Read(b []byte) (int, error) {
	n, err := c.UDPConn.Read(b)
	if err == nil && isNoData(b[:n]) {
		c.seen.Store(true)
	}
	return n, err
}

// watchedStream is a name server's TCP connection (messages with a 2-byte
// length prefix) whose answers noData checks.
type watchedStream struct {
	net.Conn
	seen *atomic.Bool
	buf  []byte
}

// Read reads from the stream and notes every complete NODATA answer.
func (c *watchedStream) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	c.buf = append(c.buf, b[:n]...)
	for len(c.buf) >= 2 {
		l := int(binary.BigEndian.Uint16(c.buf))
		if len(c.buf) < 2+l {
			break
		}
		if isNoData(c.buf[2 : 2+l]) {
			c.seen.Store(true)
		}
		c.buf = c.buf[2+l:]
	}
	return n, err
}
