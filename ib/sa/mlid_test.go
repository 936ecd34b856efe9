package sa

import (
	"testing"

	"github.com/softrdma/softrdma/wire"
	"pgregory.net/rapid"
)

// TestMLIDAllocator: against a plain set of used MLIDs, the allocator
// gives a requested free MLID, else the lowest free one, 0 only when all
// are used, and reuses released MLIDs.
func TestMLIDAllocator(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		const max = wire.MulticastLIDBase + 15
		a := newMLIDs(max)
		model := map[uint16]bool{}
		for range rapid.IntRange(1, 200).Draw(t, "ops") {
			if len(model) > 0 && rapid.Bool().Draw(t, "release") {
				var used []uint16
				for m := uint16(wire.MulticastLIDBase); m <= max; m++ {
					if model[m] {
						used = append(used, m)
					}
				}
				m := rapid.SampledFrom(used).Draw(t, "victim")
				a.release(m)
				delete(model, m)
				continue
			}
			req := rapid.Uint16Range(wire.MulticastLIDBase-2, max+2).Draw(t, "requested")
			want := uint16(0)
			if req >= wire.MulticastLIDBase && req <= max && !model[req] {
				want = req
			} else {
				for m := uint16(wire.MulticastLIDBase); m <= max; m++ {
					if !model[m] {
						want = m
						break
					}
				}
			}
			if got := a.alloc(req); got != want {
				t.Fatalf("alloc(%#x) = %#x, want %#x (used %v)", req, got, want, model)
			}
			if want != 0 {
				model[want] = true
			}
		}
	})
}
