package introspect

import (
	"log/slog"

	"github.com/softrdma/softrdma/logging"
)

// EnvLog is the environment variable LogFromEnv reads (logging.EnvLog).
const EnvLog = logging.EnvLog

// DefaultDropInterval is how often EnableLogging compares the device
// counters when LogOptions give no interval.
const DefaultDropInterval = logging.DefaultDropInterval

// LogOptions configure EnableLogging.
type LogOptions = logging.Options

// EnableLogging sends softrdma's control-plane events, device events and
// rate-limited drop reports to l (see logging.Enable).
func EnableLogging(l *slog.Logger, o LogOptions) (stop func()) { return logging.Enable(l, o) }

// LogFromEnv enables logging to stderr as SOFTRDMA_LOG says (see
// logging.FromEnv); unset, it does nothing. The stop function is never
// nil. Programs that use rdmacm get this without calling it.
func LogFromEnv() (stop func(), err error) { return logging.FromEnv() }

// ParseLogSpec builds a logger writing to stderr from a SOFTRDMA_LOG value.
func ParseLogSpec(spec string) (*slog.Logger, error) { return logging.ParseSpec(spec) }
