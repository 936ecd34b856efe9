package testenv

import (
	"runtime"
	"strings"
	"sync"
)

// allocsMu serializes AllocsInCalls: it changes runtime.MemProfileRate.
var allocsMu sync.Mutex

// AllocsInCalls is testing.AllocsPerRun counting only the allocations
// made in f's calls — by the calling goroutine, in f and what f calls —
// and not those of the process's other goroutines (another test's, the
// runtime's, a device's receive goroutine), which make AllocsPerRun
// report allocations that f did not make when the machine is loaded. It
// runs f runs times to warm up (the garbage collections that publish the
// memory profile empty sync.Pools, which these runs fill again), then runs
// times more, counted, and returns the average per counted run. Every
// allocation is sampled meanwhile (MemProfileRate 1).
func AllocsInCalls(runs int, f func()) float64 {
	allocsMu.Lock()
	defer allocsMu.Unlock()
	defer func(old int) { runtime.MemProfileRate = old }(runtime.MemProfileRate)
	runtime.MemProfileRate = 1
	before := markedAllocs()
	for range runs {
		f()
	}
	for range runs {
		allocMarker(f)
	}
	return float64(markedAllocs()-before) / float64(runs)
}

// allocMarker calls f; the allocations whose stack passes through it are
// AllocsInCalls'.
//
//go:noinline
func allocMarker(f func()) { f() }

// markedAllocs returns how many allocations the memory profile records
// under allocMarker. The profile is published by garbage collections (it
// may lag by two), so three run first.
func markedAllocs() int64 {
	for range 3 {
		runtime.GC()
	}
	var recs []runtime.MemProfileRecord
	n, _ := runtime.MemProfile(nil, true)
	for {
		recs = make([]runtime.MemProfileRecord, n+64)
		var ok bool
		if n, ok = runtime.MemProfile(recs, true); ok {
			recs = recs[:n]
			break
		}
	}
	var total int64
	for i := range recs {
		frames := runtime.CallersFrames(recs[i].Stack())
		for {
			fr, more := frames.Next()
			if strings.HasSuffix(fr.Function, "/testenv.allocMarker") {
				total += recs[i].AllocObjects
				break
			}
			if !more {
				break
			}
		}
	}
	return total
}
