//go:build !race

package introspect

// raceEnabled reports a build with the race detector.
const raceEnabled = false
