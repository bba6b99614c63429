// Package bridge carries what package throttle hands to package limiterkit
// and to the limiters without showing it in throttle's user-facing API:
// the option values, the bounds of a Rate, and the decorator machinery
// (see package limiterkit).
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

// Bounds of a valid throttle.Rate: valid rates go from one event per
// MaxPeriod to MaxPerSecond events per second. Limiters that size their
// state from a rate's bounds read them here.
const (
	// MaxPeriod is the longest period between events a Rate accepts.
	MaxPeriod = 366 * 24 * time.Hour
	// MaxPerSecond is the highest rate a Rate accepts, in events per second.
	MaxPerSecond = int64(time.Second)
)

// Method names the Limiter method a call was made through.
type Method uint8

// Methods a call can be made through.
const (
	MethodAllow      Method = iota // Limiter.Allow
	MethodAllowQuota               // QuotaAllower.AllowQuota
	MethodTryHold                  // Holder.TryHold
	MethodHold                     // Holder.Hold
	MethodReserve                  // Reserver.Reserve
)

var methodNames = [...]string{"Allow", "AllowQuota", "TryHold", "Hold", "Reserve"}

// String returns the method's name.
func (m Method) String() string {
	if int(m) < len(methodNames) {
		return methodNames[m]
	}
	return "Method(?)"
}

// Holds reports whether an allowed call of m holds its units until they
// are released (TryHold, Hold).
func (m Method) Holds() bool { return m == MethodTryHold || m == MethodHold }

// The decorator machinery of package throttle, set by its init and typed
// by package limiterkit, the only reader (see throttle's decorate.go).
var Decorate, Invoke, NewReservation any

// ObservesLatency reports whether o, a throttle.Observer, asks for each
// call to be timed (see throttle.Observer).
func ObservesLatency(o any) bool {
	lo, ok := o.(interface{ ObservesLatency() bool })
	return ok && lo.ObservesLatency()
}
