// Package logging is softrdma's structured logging through log/slog: the
// logger softrdma's packages write to (the RDMA CM's joins, leaves and
// errors) and a watcher of the devices' counters that reports drops and
// device events. SOFTRDMA_LOG turns it on in any program that uses the
// rdmacm package (rdmacm calls StartFromEnv when the first event channel
// is created); Enable turns it on from code. It depends on verbs only, so
// a program gets its logs without the metrics that package introspect
// brings.
package logging

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/softrdma/softrdma/internal/envvars"
	"github.com/softrdma/softrdma/verbs"
	"github.com/softrdma/softrdma/verbs/driver"
)

// EnvLog is the environment variable FromEnv reads: a level (debug, info,
// warn, error), optionally followed by ",json" for JSON records; e.g.
// SOFTRDMA_LOG=info or SOFTRDMA_LOG=debug,json. Records go to stderr.
const EnvLog = "SOFTRDMA_LOG"

// DefaultDropInterval is how often Enable compares the device counters
// when Options give no interval.
const DefaultDropInterval = time.Second

// Options configure Enable.
type Options struct {
	// DropInterval is how often the device counters are compared: drops
	// are logged at most once per device per interval, as one record
	// with the count of each reason (DefaultDropInterval when 0).
	DropInterval time.Duration
}

// current is the logger of softrdma's packages; nil: logging is off.
var current atomic.Pointer[slog.Logger]

// Logger returns the logger softrdma's packages write to, nil when
// logging is off.
func Logger() *slog.Logger { return current.Load() }

// SetLogger makes l the logger of softrdma's packages (nil: off), without
// the counter watcher Enable starts.
func SetLogger(l *slog.Logger) { current.Store(l) }

// isDrop reports whether a counter's increase is reported: the drops
// (counters with a reason) and the refused sends.
func isDrop(c verbs.CounterDesc) bool {
	return c.Reason != "" || c.Name == driver.CounterSendErrors.Name
}

var state struct {
	sync.Mutex
	stop func()
	w    *dropWatcher
}

// Enable sends softrdma's control-plane events to l as structured logs,
// until the returned stop function is called:
//
//   - RDMA CM: joins and leaves (Info), failed joins (Warn), QP attach
//     failures that turn MULTICAST_JOIN into MULTICAST_ERROR (Error);
//   - devices appearing and going away (Info), changes of their network
//     interface: removal, address added or removed (Info);
//   - drops and send errors (Warn; Debug when only self-loopback drops,
//     which BLOCK_SELF_MCAST_LB asks for, increased): a goroutine compares
//     the device counters every DropInterval and logs, per device, one
//     record with the increase of each drop reason — rate-limited by
//     construction.
//
// Enabling again replaces the previous logger (its stop function then
// does nothing more).
func Enable(l *slog.Logger, o Options) (stop func()) {
	if o.DropInterval <= 0 {
		o.DropInterval = DefaultDropInterval
	}
	state.Lock()
	defer state.Unlock()
	if state.stop != nil {
		state.stop()
	}
	SetLogger(l)
	w := &dropWatcher{l: l, every: o.DropInterval, done: make(chan struct{}), exited: make(chan struct{}), devs: map[*verbs.Device]*watched{}}
	w.scan(false)
	go w.run()
	var once sync.Once
	halt := func() {
		once.Do(func() {
			SetLogger(nil)
			close(w.done)
			<-w.exited
		})
	}
	state.stop, state.w = halt, w
	return func() {
		state.Lock()
		defer state.Unlock()
		halt()
		if state.w == w {
			state.stop, state.w = nil, nil
		}
	}
}

// FromEnv enables logging to stderr as SOFTRDMA_LOG says (see EnvLog);
// unset, it does nothing. The stop function is never nil.
func FromEnv() (stop func(), err error) {
	v := os.Getenv(EnvLog)
	if v == "" {
		return func() {}, nil
	}
	l, err := ParseSpec(v)
	if err != nil {
		return func() {}, err
	}
	return Enable(l, Options{}), nil
}

var envOnce struct {
	sync.Once
	err error
}

// StartFromEnv is FromEnv once per process, for the packages that start
// logging on their first use (rdmacm's first event channel); it returns
// the first call's error every time. The logging it starts lasts as long
// as the process (or until Enable replaces it). The first call also names
// on stderr any SOFTRDMA_ environment variable softrdma does not read.
func StartFromEnv() error {
	envvars.WarnOnce()
	envOnce.Do(func() {
		state.Lock()
		on := state.stop != nil
		state.Unlock()
		if !on { // a program that enabled logging itself keeps its logger
			_, envOnce.err = FromEnv()
		}
	})
	return envOnce.err
}

// ParseSpec builds a logger writing to stderr from a SOFTRDMA_LOG value.
func ParseSpec(spec string) (*slog.Logger, error) {
	levelStr, format, _ := strings.Cut(spec, ",")
	var level slog.Level
	if err := level.UnmarshalText([]byte(levelStr)); err != nil {
		return nil, fmt.Errorf("%s=%s: level %q: want debug, info, warn or error", EnvLog, spec, levelStr)
	}
	opts := &slog.HandlerOptions{Level: level}
	switch format {
	case "", "text":
		return slog.New(slog.NewTextHandler(os.Stderr, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(os.Stderr, opts)), nil
	}
	return nil, fmt.Errorf("%s=%s: format %q: want text or json", EnvLog, spec, format)
}

// dropWatcher polls the devices' counters.
type dropWatcher struct {
	l      *slog.Logger
	every  time.Duration
	done   chan struct{}
	exited chan struct{}
	devs   map[*verbs.Device]*watched
}

type watched struct {
	name   string
	last   []uint64
	cancel func()
}

func (w *dropWatcher) run() {
	defer close(w.exited)
	t := time.NewTicker(w.every)
	defer t.Stop()
	for {
		select {
		case <-w.done:
			for _, d := range w.devs {
				d.cancel()
			}
			return
		case <-t.C:
			w.scan(true)
		}
	}
}

// scan notices new and vanished devices and logs counter increases.
func (w *dropWatcher) scan(report bool) {
	seen := map[*verbs.Device]bool{}
	for _, d := range verbs.DefaultHost().Devices() {
		seen[d] = true
		schema, c, ok := d.Counters()
		if !ok {
			continue
		}
		wd := w.devs[d]
		if wd == nil {
			name := d.Name()
			if report {
				w.l.Info("device created", slog.String("device", name))
			}
			wd = &watched{name: name, last: c, cancel: func() {}}
			if cancel, ok := d.Subscribe(func(ev verbs.DeviceEvent) {
				attrs := []any{slog.String("device", name), slog.String("event", ev.Kind)}
				if ev.Addr.IsValid() {
					attrs = append(attrs, slog.String("addr", ev.Addr.String()))
				}
				w.l.Info("device event", attrs...)
			}); ok {
				wd.cancel = cancel
			}
			w.devs[d] = wd
			continue
		}
		var attrs []any
		var total uint64
		onlySelf := true
		for i, k := range schema {
			if !isDrop(k) || i >= len(wd.last) {
				continue
			}
			if delta := c[i] - wd.last[i]; delta > 0 {
				attrs = append(attrs, slog.Uint64(k.Name, delta))
				total += delta
				onlySelf = onlySelf && k.Name == "self_loopback_drops"
			}
		}
		wd.last = c
		if total == 0 {
			continue
		}
		level := slog.LevelWarn
		if onlySelf {
			level = slog.LevelDebug
		}
		w.l.Log(context.Background(), level, "drops",
			slog.String("device", wd.name),
			slog.Duration("interval", w.every),
			slog.Uint64("dropped", total),
			slog.Group("by_reason", attrs...))
	}
	for d, wd := range w.devs {
		if !seen[d] {
			wd.cancel()
			delete(w.devs, d)
			w.l.Info("device closed", slog.String("device", wd.name))
		}
	}
}
