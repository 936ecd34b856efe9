package introspect

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/softrdma/softrdma/rdmacm"
	"github.com/softrdma/softrdma/verbs"
)

// EnvLog is the environment variable LogFromEnv reads: a level (debug,
// info, warn, error), optionally followed by ",json" for JSON records;
// e.g. SOFTRDMA_LOG=info or SOFTRDMA_LOG=debug,json. Records go to stderr.
const EnvLog = "SOFTRDMA_LOG"

// DefaultDropInterval is how often EnableLogging compares the device
// counters when LogOptions give no interval.
const DefaultDropInterval = time.Second

// LogOptions configure EnableLogging.
type LogOptions struct {
	// DropInterval is how often the device counters are compared: drops
	// are logged at most once per device per interval, as one record
	// with the count of each reason (DefaultDropInterval when 0).
	DropInterval time.Duration
}

// isDrop reports whether a counter's increase EnableLogging reports: the
// drops (counters with a reason) and the refused sends.
func isDrop(c verbs.CounterDesc) bool { return c.Reason != "" || c.Name == "send_errors" }

var logging struct {
	sync.Mutex
	stop func()
	w    *dropWatcher
}

// EnableLogging sends softrdma's control-plane events to l as structured
// logs, until the returned stop function is called:
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
func EnableLogging(l *slog.Logger, o LogOptions) (stop func()) {
	if o.DropInterval <= 0 {
		o.DropInterval = DefaultDropInterval
	}
	logging.Lock()
	defer logging.Unlock()
	if logging.stop != nil {
		logging.stop()
	}
	rdmacm.SetLogger(l)
	w := &dropWatcher{l: l, every: o.DropInterval, done: make(chan struct{}), exited: make(chan struct{}), devs: map[*verbs.Device]*watched{}}
	w.scan(false)
	go w.run()
	var once sync.Once
	halt := func() {
		once.Do(func() {
			rdmacm.SetLogger(nil)
			close(w.done)
			<-w.exited
		})
	}
	logging.stop, logging.w = halt, w
	return func() {
		logging.Lock()
		defer logging.Unlock()
		halt()
		if logging.w == w {
			logging.stop, logging.w = nil, nil
		}
	}
}

// LogFromEnv enables logging to stderr as SOFTRDMA_LOG says (see EnvLog);
// unset, it does nothing. The stop function is never nil.
func LogFromEnv() (stop func(), err error) {
	v := os.Getenv(EnvLog)
	if v == "" {
		return func() {}, nil
	}
	l, err := ParseLogSpec(v)
	if err != nil {
		return func() {}, err
	}
	return EnableLogging(l, LogOptions{}), nil
}

// ParseLogSpec builds a logger writing to stderr from a SOFTRDMA_LOG value.
func ParseLogSpec(spec string) (*slog.Logger, error) {
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
