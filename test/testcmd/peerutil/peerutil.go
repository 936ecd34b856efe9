// Package peerutil holds what the test peer programs (mcpeer, mcreply)
// share: waiting for one CM event and printing per-QPN counts.
package peerutil

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/softrdma/softrdma/rdmacm"
)

// EventTimeout bounds Event's wait.
const EventTimeout = 10 * time.Second

// Event waits for the next event of ch, acks it, and returns its UD
// parameters; an error unless it is want with status 0.
func Event(ch *rdmacm.EventChannel, want rdmacm.EventType) (rdmacm.UDParam, error) {
	ctx, cancel := context.WithTimeout(context.Background(), EventTimeout)
	defer cancel()
	ev, err := ch.GetEvent(ctx)
	if err != nil {
		return rdmacm.UDParam{}, fmt.Errorf("waiting for %v: %w", want, err)
	}
	defer ev.Ack()
	if ev.Event != want {
		return rdmacm.UDParam{}, fmt.Errorf("got %v status %d, want %v", ev.Event, ev.Status, want)
	}
	return ev.Param, nil
}

// FormatCounts prints counts by QPN as "0xQPN:n,…" in QPN order, "-" for
// none.
func FormatCounts(by map[uint32]int) string {
	if len(by) == 0 {
		return "-"
	}
	var parts []string
	for _, qpn := range slices.Sorted(maps.Keys(by)) {
		parts = append(parts, fmt.Sprintf("%#x:%d", qpn, by[qpn]))
	}
	return strings.Join(parts, ",")
}
