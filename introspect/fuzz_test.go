package introspect

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"reflect"
	"strings"
	"testing"

	"github.com/softrdma/softrdma/capture"
)

// fuzzAddr and fuzzToken are the TCP endpoint FuzzRequest plays.
const (
	fuzzAddr  = "127.0.0.1:4000"
	fuzzToken = "0123456789abcdef0123"
)

// fuzzPaths are the endpoint's paths and the query parameters each takes.
var fuzzPaths = map[string][]string{
	"/": nil, "/v1/snapshot": nil, "/v1/devices": nil, "/v1/groups": nil, "/v1/ids": nil, "/metrics": nil,
	"/v1/capture": {"device", "dir", "count", "duration", "snaplen"},
}

// FuzzRequest feeds arbitrary methods, request targets (paths and
// queries) and Host headers, with and without the token, to a TCP
// endpoint's handler (the guard and every view). It must never panic (a
// 500) and must answer as the trust model and the paths say:
//   - Host other than 127.0.0.1:4000 or localhost:4000 (any case): 403;
//     then no token: 401;
//   - an unknown path: 404 (a path ServeMux cleans: a redirect); a known
//     one with a method other than GET or HEAD: 405; a query that does not
//     parse, names a parameter the path does not take or repeats one: 400;
//   - an accepted capture request has its parameters in range and
//     survives CaptureRequest.query; a GET that succeeds returns a pcap
//     header or valid JSON; every error has a JSON {"error": …} body.
func FuzzRequest(f *testing.F) {
	for _, tgt := range []string{
		"/", "/v1/snapshot", "/v1/devices?", "/v1/groups", "/v1/ids", "/metrics",
		"/v1/capture?device=rxe_lo&dir=sent&count=3&duration=1s&snaplen=100",
		"/v1/capture?dir=received&count=0", "/v1/capture?count=1&count=2", "/v1/capture?snaplen=262145",
		"/v1/capture?duration=-1s", "/v1/capture?x=%zz", "/v1/snapshot?x=1", "/v1//snapshot", "/v1/../metrics",
		"/nothing", "*", "http://127.0.0.1:4000/v1/ids",
	} {
		f.Add("GET", tgt, fuzzAddr, true)
	}
	f.Add("HEAD", "/v1/capture?device=nosuch", "localhost:4000", true)
	f.Add("POST", "/v1/snapshot", fuzzAddr, true)
	f.Add("GET", "/v1/snapshot", "evil.example:4000", true)
	f.Add("GET", "/v1/snapshot", fuzzAddr, false)
	f.Add("GET", "/v1/snapshot", "[::1]:4000", true)
	s := &Server{network: "tcp", addr: fuzzAddr, token: fuzzToken}
	h := s.guard(Handler())
	f.Fuzz(func(t *testing.T, method, target, host string, auth bool) {
		raw := method + " " + target + " HTTP/1.1\r\nHost: " + host + "\r\n"
		if auth {
			raw += "Authorization: Bearer " + fuzzToken + "\r\n"
		}
		req, err := http.ReadRequest(bufio.NewReader(strings.NewReader(raw + "\r\n")))
		if err != nil {
			return // net/http refuses it before any handler runs
		}
		ctx, cancel := context.WithCancel(context.Background())
		cancel() // a capture ends as soon as it started
		req = req.WithContext(ctx)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		code, body := rec.Code, rec.Body.Bytes()
		fail := func(why string) {
			t.Helper()
			t.Fatalf("%s %q Host %q auth %v: %d %.200q: %s", method, target, req.Host, auth, code, body, why)
		}
		if code >= 400 && req.Method != http.MethodHead {
			var e errorBody
			if json.Unmarshal(body, &e) != nil || e.Error == "" {
				fail("an error without a JSON error body")
			}
		}
		if code == http.StatusInternalServerError {
			fail("internal error")
		}
		// What the request carries as parsed: a Host value with a line
		// break in it ends the header block early, before the token.
		hostOK := req.Host == fuzzAddr || strings.EqualFold(req.Host, "localhost:4000")
		authed := req.Header.Get("Authorization") == "Bearer "+fuzzToken
		switch {
		case !hostOK:
			if code != http.StatusForbidden {
				fail("foreign Host not refused with 403")
			}
			return
		case !authed:
			if code != http.StatusUnauthorized {
				fail("no token, not 401")
			}
			return
		}
		if code == http.StatusMovedPermanently || code == http.StatusTemporaryRedirect || code == http.StatusPermanentRedirect {
			return // ServeMux cleaning a path (or CONNECT)
		}
		params, known := fuzzPaths[req.URL.Path]
		if !known || req.Method == http.MethodConnect {
			if code != http.StatusNotFound && code != http.StatusMethodNotAllowed {
				fail("unknown path not 404")
			}
			return
		}
		if req.Method != http.MethodGet && req.Method != http.MethodHead {
			if code != http.StatusMethodNotAllowed {
				fail("method not 405")
			}
			return
		}
		q, qerr := url.ParseQuery(req.URL.RawQuery)
		bad := qerr != nil
		for k, vs := range q {
			bad = bad || len(vs) > 1 || !contains(params, k)
		}
		if bad && req.URL.Path != "/metrics" {
			if code != http.StatusBadRequest {
				fail("bad query not 400")
			}
			return
		}
		if code != http.StatusOK {
			if req.URL.Path == "/v1/capture" && (code == http.StatusBadRequest || code == http.StatusNotFound || code == http.StatusServiceUnavailable) {
				return // a value out of range, no such device, or busy
			}
			if req.URL.Path == "/metrics" && code == http.StatusBadRequest {
				return
			}
			fail("a good request not served")
		}
		switch {
		case req.URL.Path == "/v1/capture":
			cr, err := parseCaptureRequest(q)
			if err != nil {
				fail("served a capture whose parameters do not parse: " + err.Error())
			}
			if cr.Count < 0 || cr.Duration < 0 || cr.Snaplen < 0 || cr.Snaplen > maxCaptureSnaplen || cr.Direction > capture.Received {
				fail("capture parameters out of range")
			}
			q2, err := url.ParseQuery(cr.query())
			if err != nil {
				fail("query of the request does not parse")
			}
			if cr2, err := parseCaptureRequest(q2); err != nil || !reflect.DeepEqual(cr, cr2) {
				fail("capture request does not survive query()")
			}
			if req.Method == http.MethodGet && (len(body) < 24 || binary.LittleEndian.Uint32(body) != 0xa1b2c3d4) {
				fail("capture without a pcap header")
			}
		case req.Method == http.MethodGet && req.URL.Path != "/" && req.URL.Path != "/metrics":
			if !json.Valid(body) {
				fail("JSON view not JSON")
			}
		}
	})
}

func contains(l []string, s string) bool {
	for _, x := range l {
		if x == s {
			return true
		}
	}
	return false
}
