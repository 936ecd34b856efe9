// Command grhpeer is a test helper of the interop suite: a softrdma
// multicast receiver that prints every receive completion in full, so the
// suite can compare what softrdma delivered with the frames on the wire
// (mckey only counts completions).
//
//	grhpeer -b 10.78.0.10 -m 239.1.2.3 -C 10 -S 1024 [-timeout 60s]
//
// It resolves the group from the bound address, creates a UD QP, posts C
// receives of 40 + S bytes (one buffer each), joins as a full member and
// prints "joined qpn 0x<QPN>", then one line per completion:
//
//	wc <i> status=<n> opcode=<n> byte_len=<n> src_qp=0x<h> imm=0x<h> flags=0x<h> qp_num=0x<h> grh=<80 hex digits> payload=<hex>
//
// and "done <C>" after C completions (exit status 0), or "timeout <got>"
// when -timeout passed without a completion (exit status 2). Setup errors
// print "err <text>" and exit with status 1.
package main

import (
	// Every kind of device (RoCEv2, InfiniBand, the kernel's with the rdmacore tag).
	_ "github.com/softrdma/softrdma/provider/all"

	"context"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/netip"
	"os"
	"time"

	"github.com/softrdma/softrdma/rdmacm"
	"github.com/softrdma/softrdma/verbs"
)

func main() { os.Exit(run()) }

func run() int {
	bind := flag.String("b", "", "local address")
	group := flag.String("m", "", "IPv4 multicast group")
	count := flag.Int("C", 10, "completions to wait for")
	size := flag.Int("S", 100, "payload bytes per receive buffer")
	timeout := flag.Duration("timeout", 60*time.Second, "give up after this long without a completion")
	flag.Parse()
	fail := func(what string, err error) int {
		fmt.Printf("err %s: %v\n", what, err)
		return 1
	}
	src, err := netip.ParseAddr(*bind)
	if err != nil {
		return fail("-b", err)
	}
	grp, err := netip.ParseAddr(*group)
	if err != nil {
		return fail("-m", err)
	}
	srcAddr := &net.UDPAddr{IP: src.AsSlice()}
	dstAddr := &net.UDPAddr{IP: grp.AsSlice()}

	ch, err := rdmacm.CreateEventChannel()
	if err != nil {
		return fail("event channel", err)
	}
	defer ch.Close()
	id, err := rdmacm.CreateID(ch, nil, rdmacm.PS_UDP)
	if err != nil {
		return fail("create id", err)
	}
	defer id.Destroy()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	next := func(want rdmacm.EventType) error {
		ev, err := ch.GetEvent(ctx)
		if err != nil {
			return err
		}
		defer ev.Ack()
		if ev.Event != want {
			return fmt.Errorf("event %v (status %d), want %v", ev.Event, ev.Status, want)
		}
		return nil
	}
	if err := id.ResolveAddr(srcAddr, dstAddr, 2*time.Second); err != nil {
		return fail("resolve", err)
	}
	if err := next(rdmacm.EventAddrResolved); err != nil {
		return fail("resolve", err)
	}
	pd, err := id.Verbs().AllocPD()
	if err != nil {
		return fail("pd", err)
	}
	defer pd.Dealloc()
	cq, err := id.Verbs().CreateCQ(2 * *count)
	if err != nil {
		return fail("cq", err)
	}
	defer cq.Destroy()
	err = id.CreateQP(pd, &verbs.QPInitAttr{
		SendCQ: cq, RecvCQ: cq, QPType: verbs.QPTypeUD,
		Cap: verbs.QPCap{MaxSendWR: 1, MaxRecvWR: *count, MaxSendSGE: 1, MaxRecvSGE: 1},
	})
	if err != nil {
		return fail("qp", err)
	}
	defer id.DestroyQP()
	slot := verbs.GRHLen + *size
	mem := make([]byte, *count*slot)
	mr, err := pd.RegMR(mem, verbs.AccessLocalWrite)
	if err != nil {
		return fail("mr", err)
	}
	defer mr.Dereg()
	for i := 0; i < *count; i++ {
		if err := id.QP().PostRecv(&verbs.RecvWR{WRID: uint64(i), SGList: []verbs.SGE{mr.SGE(i*slot, slot)}}); err != nil {
			return fail("post recv", err)
		}
	}
	if err := id.JoinMulticast(dstAddr, nil); err != nil {
		return fail("join", err)
	}
	if err := next(rdmacm.EventMulticastJoin); err != nil {
		return fail("join", err)
	}
	fmt.Printf("joined qpn %#x\n", id.QP().Num())

	var wc [8]verbs.WC
	got := 0
	for got < *count {
		k, err := cq.Poll(wc[:])
		if err != nil {
			return fail("poll", err)
		}
		for _, w := range wc[:k] {
			off := int(w.WRID) * slot
			n := min(int(w.ByteLen), slot)
			var grh, payload []byte
			if n >= verbs.GRHLen {
				grh, payload = mem[off:off+verbs.GRHLen], mem[off+verbs.GRHLen:off+n]
			}
			fmt.Printf("wc %d status=%d opcode=%d byte_len=%d src_qp=%#x imm=%#x flags=%#x qp_num=%#x grh=%s payload=%s\n",
				got, w.Status, w.Opcode, w.ByteLen, w.SrcQP, w.ImmData, uint32(w.Flags), w.QPNum,
				hex.EncodeToString(grh), hex.EncodeToString(payload))
			got++
		}
		if k > 0 {
			continue
		}
		wctx, wcancel := context.WithTimeout(context.Background(), *timeout)
		err = cq.Wait(wctx)
		wcancel()
		if errors.Is(err, context.DeadlineExceeded) {
			fmt.Printf("timeout %d\n", got)
			id.LeaveMulticast(dstAddr)
			return 2
		} else if err != nil {
			return fail("wait", err)
		}
	}
	if err := id.LeaveMulticast(dstAddr); err != nil {
		return fail("leave", err)
	}
	fmt.Printf("done %d\n", got)
	return 0
}
