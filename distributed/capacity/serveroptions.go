package capacity

import (
	"time"

	"github.com/throttlekit/throttle"
)

// The options of NewServer, their defaults, and the bounds on requests.

// Bounds on requests, and defaults of the server's bounds.
const (
	// maxIDLen is the longest client or resource id, in bytes.
	maxIDLen = 256
	// maxRequestResources is the most resources one request may carry.
	maxRequestResources = 1000
	// DefaultMaxClients is the default bound on clients per resource.
	DefaultMaxClients = 100_000
	// DefaultMaxResources is the default bound on resources per server.
	DefaultMaxResources = 10_000
	// DefaultMaxLeases is the default bound on the client leases (a
	// client's lease or demand on a resource) a server holds in all: a
	// few hundred bytes each.
	DefaultMaxLeases = 200_000
	// DefaultMaxLeasesPerClient is the default bound on the resources
	// one client id holds leases on, as many as a Client can ask for.
	DefaultMaxLeasesPerClient = maxRequestResources
	// defaultJitter is the default spread of refresh intervals: ±10%.
	defaultJitter = 0.1
	// maxWeightValue bounds ResourceRequest.Weight.
	maxWeightValue = maxWeight
)

// ServerOption configures a Server.
type ServerOption func(*serverSettings)

type serverSettings struct {
	clock        throttle.Clock
	maxClients   int
	maxResources int
	maxLeases    int
	perClient    int
	jitter       float64
	seed         uint64
	grace        time.Duration
	parent       *parentSettings
	keys         leaseKeys
}

// WithServerClock makes the server read time from c (for tests on virtual
// time). By default it reads the system's monotonic clock.
func WithServerClock(c throttle.Clock) ServerOption {
	return func(s *serverSettings) { s.clock = c }
}

// WithMaxClients bounds the clients per resource (default
// DefaultMaxClients); requests beyond fail with ErrExhausted.
func WithMaxClients(n int) ServerOption { return func(s *serverSettings) { s.maxClients = n } }

// WithMaxResources bounds the resources a server tracks (default
// DefaultMaxResources); requests beyond fail with ErrExhausted. A
// resource no client holds or wants any more is forgotten within
// dropInterval, and frees its place.
func WithMaxResources(n int) ServerOption { return func(s *serverSettings) { s.maxResources = n } }

// WithMaxLeases bounds the client leases (a client's lease or demand on
// one resource) the server holds in all, and those of one client id
// (defaults DefaultMaxLeases and DefaultMaxLeasesPerClient): a request
// that would need more fails with an error wrapping ErrExhausted, and
// nothing changes. The bound per client keeps one client id from taking
// the whole table; with unauthenticated clients, which can pick any id,
// only the total bounds memory. Leases free their place when they expire
// or are released.
func WithMaxLeases(total, perClient int) ServerOption {
	return func(s *serverSettings) { s.maxLeases, s.perClient = total, perClient }
}

// WithJitter spreads refresh intervals uniformly by ±f of their length
// (default defaultJitter), so that clients do not refresh in lockstep.
func WithJitter(f float64) ServerOption { return func(s *serverSettings) { s.jitter = f } }

// WithDecreaseGrace is kept for compatibility and has no effect. A lease
// the server lowers counts at its old size until the client confirms the
// lower one (a refresh reporting Has at most the new capacity) or the old
// lease expires, however late or lost the answer is, so no grace period
// is needed; d must still be >= 0.
func WithDecreaseGrace(d time.Duration) ServerOption {
	return func(s *serverSettings) { s.grace = d }
}

// withSeed seeds the jitter, for reproducible simulations.
func withSeed(seed uint64) ServerOption { return func(s *serverSettings) { s.seed = seed } }
