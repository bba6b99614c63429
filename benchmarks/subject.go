package benchmarks

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/throttlekit/throttle"
)

// Config is the one limit every subject is built with, so that all of
// them enforce the same thing: Limit units per Window. For a bucket that
// is a burst of Limit refilled at Limit/Window; for a window counter it
// is Limit per Window; for a log, Limit in any Window.
type Config struct {
	Limit  int
	Window time.Duration
	// Clock drives the subject on virtual time when it is not nil; only
	// subjects with VirtualTime set accept one.
	Clock throttle.Clock
}

// Rate returns Limit/Window as a throttle.Rate.
func (c Config) Rate() throttle.Rate { return throttle.NewRate(c.Limit, c.Window) }

// PerSecond returns Limit/Window in events per second.
func (c Config) PerSecond() float64 { return float64(c.Limit) / c.Window.Seconds() }

// Subject is one limiter under comparison: one of this module's
// algorithms or a peer library behind an adapter to throttle.Limiter.
type Subject struct {
	Name string // short name used in tables and charts
	Ours bool   // one of this module's algorithms
	Algo string // "token bucket", "fixed window", ...

	Keyed       bool // tells keys apart (otherwise it is one resource)
	VirtualTime bool // accepts Config.Clock, so traces run on virtual time
	Weighted    bool // Allow with n > 1 charges n units, all or nothing
	Blocks      bool // has no denied path: Allow waits for its turn

	// Note says where its semantics differ from "Limit units per Window,
	// denied requests cost nothing".
	Note string

	// SpeedConfig, when set, adjusts the allowed-path speed configuration
	// for a subject that would otherwise deny on it (see its Note).
	SpeedConfig func(Config) Config

	// New builds a fresh instance. The returned limiter may implement
	// io.Closer; Close it when done.
	New func(Config) (throttle.Limiter, error)
}

// Open builds s with c, refusing a clock that s cannot take.
func (s Subject) Open(c Config) (throttle.Limiter, error) {
	if c.Clock != nil && !s.VirtualTime {
		return nil, fmt.Errorf("%s does not accept a clock", s.Name)
	}
	l, err := s.New(c)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", s.Name, err)
	}
	return l, nil
}

// closeLimiter closes l if it has a Close method.
func closeLimiter(l throttle.Limiter) {
	switch c := l.(type) {
	case io.Closer:
		_ = c.Close()
	case interface{ Close() }:
		c.Close()
	}
}

// Subjects returns every subject, this module's algorithms first, in a
// fixed order.
func Subjects() []Subject {
	out := make([]Subject, 0, len(ours)+len(peers))
	out = append(out, ours...)
	return append(out, peers...)
}

// Lookup returns the subject named name.
func Lookup(name string) (Subject, bool) {
	for _, s := range Subjects() {
		if s.Name == name {
			return s, true
		}
	}
	return Subject{}, false
}

// allowed is the decision of a peer that only says yes or no.
func allowed(ok bool, limit int) throttle.Decision {
	return throttle.Decision{Allowed: ok, Limit: limit}
}

var bg = context.Background()
