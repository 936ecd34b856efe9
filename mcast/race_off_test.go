//go:build !race

package mcast_test

// raceEnabled reports a build with the race detector.
const raceEnabled = false
