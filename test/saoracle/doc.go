// Package saoracle compares softsm's SA with OpenSM's, field by field:
// OpenSM 3.3.23 (Debian's opensm) runs under ibsim (ibsim-utils,
// libumad2sim0), a small libibumad client (testdata/saclient.c, compiled
// by the test) sends it raw SA MADs from simulated HCAs, and the same MADs
// go to softsm's raw SA port (and, for a request made on behalf of another
// port, over the fabric from a port of softsm's subnet). Every header
// field, every ClassPortInfo and MCMemberRecord field and the RMPP framing
// of the answers must match, or be listed with its reason in the
// test's table of documented differences.
//
// The test runs with SOFTRDMA_TEST_OPENSM=1 (a step of .ci/run); it
// needs opensm, ibsim, libumad2sim.so, libibumad's headers and a C
// compiler, and skips (fails under CI=true) when one is missing. Every
// process it starts talks over ibsim's abstract unix sockets and
// loopback only.
package saoracle
