//go:build !race

package testenv

// RaceEnabled reports a build with the race detector, in which sync.Pool
// drops a random share of what is put in it (so steady-state allocation
// tests of code that pools its buffers run without -race).
const RaceEnabled = false
