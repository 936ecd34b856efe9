package softverbs

import (
	"sync/atomic"
	"testing"

	"github.com/softrdma/softrdma/verbs"
)

// TestPollHint follows the word SetPollHint keeps (what softrdma's C
// ibv_poll_cq reads before it enters Go): 0 on a fresh CQ, Ready while
// completions wait and 0 again once they are polled, Ready for good once
// the CQ overran, Source once a Burst delivered from a source (an empty
// Poll then makes progress), Ready when the CQ is destroyed; after
// SetPollHint(nil) the word is no longer written.
func TestPollHint(t *testing.T) {
	e := newFakeEnv(t, false, 16)
	ctx := e.pd.Context()
	cq, err := ctx.CreateCQ(2)
	if err != nil {
		t.Fatal(err)
	}
	o := cq.Ops().(*cqObj)
	var w atomic.Uint32
	w.Store(99)
	o.SetPollHint(&w)
	want := func(step string, v uint32) {
		t.Helper()
		if got := w.Load(); got != v {
			t.Errorf("%s: hint %#x, want %#x", step, got, v)
		}
	}
	want("fresh CQ", 0)
	wc := verbs.WC{Status: verbs.WCSuccess, Opcode: verbs.WCOpSend}
	o.pushOrOverrun(&wc)
	want("one completion", PollHintReady)
	var buf [4]verbs.WC
	if n, err := cq.Poll(buf[:]); n != 1 || err != nil {
		t.Fatalf("Poll: %d, %v", n, err)
	}
	want("polled empty", 0)
	if n, err := cq.Poll(buf[:]); n != 0 || err != nil {
		t.Fatalf("Poll of an empty CQ: %d, %v", n, err)
	}
	want("empty poll", 0)
	o.pushAllOrOverrun([]verbs.WC{wc, wc, wc})
	want("overrun", PollHintReady)
	if n, err := cq.Poll(buf[:]); n != 2 || err != nil {
		t.Fatalf("Poll of an overrun CQ: %d, %v", n, err)
	}
	want("overrun, drained", PollHintReady) // the next Poll gives EOVERFLOW

	cq2, err := ctx.CreateCQ(2)
	if err != nil {
		t.Fatal(err)
	}
	o2 := cq2.Ops().(*cqObj)
	var w2 atomic.Uint32
	o2.SetPollHint(&w2)
	b := &Burst{Src: NewSource(&pipeInput{})}
	b.add(o2)
	if got := w2.Load(); got != PollHintSource {
		t.Errorf("after a Burst from a source: hint %#x, want %#x", got, PollHintSource)
	}
	if err := cq2.Destroy(); err != nil {
		t.Fatal(err)
	}
	if got := w2.Load(); got != PollHintReady|PollHintSource {
		t.Errorf("destroyed: hint %#x, want %#x", got, PollHintReady|PollHintSource)
	}

	o.SetPollHint(nil)
	w.Store(99)
	if err := cq.Destroy(); err != nil {
		t.Fatal(err)
	}
	want("after SetPollHint(nil)", 99)
}
