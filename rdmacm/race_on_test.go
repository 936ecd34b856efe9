//go:build race

package rdmacm

// raceEnabled reports a build with the race detector.
const raceEnabled = true
