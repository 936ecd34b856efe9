//go:build !race

package main

// raceEnabled tells TestMain to build the child binaries with -race too.
const raceEnabled = false
