// Package bridge carries what package throttle hands to package limiterkit
// without showing it in throttle's user-facing API: the option values.
package bridge

import "time"

// Settings are the values set by throttle.Options.
type Settings struct {
	Clock         interface{ Now() time.Time }
	ClockSet      bool // WithClock was used, so a nil Clock is a mistake
	MaxKeys       int
	MaxKeyLen     int
	SweepInterval time.Duration
	KeyedOption   string // the name of the last option that only keyed limiters use
}
