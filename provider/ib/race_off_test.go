//go:build !race

package ib_test

// raceEnabled reports a build with the race detector.
const raceEnabled = false
