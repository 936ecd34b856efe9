//go:build !race

package main

// raceEnabled tells TestMain to build the softsm binary with -race too.
const raceEnabled = false
