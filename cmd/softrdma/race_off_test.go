//go:build !race

package main

// raceEnabled makes TestMain build the mckey binary with -race too.
const raceEnabled = false
