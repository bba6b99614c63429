// Package redislimit shares a limit between many processes on many
// machines through Redis: workers calling an external API whose token
// allows "at most once every six seconds", a per-user quota enforced by a
// fleet of servers.
//
// Every limiter implements throttle.Limiter (token and leaky buckets also
// throttle.Reserver) with the same decisions as the local package of the
// same algorithm for the same trace, so moving from a local limit to a
// shared one is a one-line change:
//
//	l, err := tokenbucket.New(throttle.PerSecond(100), 20)              // one process
//	l, err := redislimit.NewTokenBucket(rdb, throttle.PerSecond(100), 20) // every process
//
// Algorithms: NewTokenBucket (GCRA, as tokenbucket and leakybucket; with
// throttle.Every(d) and a burst of 1, permits at least d apart),
// NewFixedWindow (as fixedwindow.New), NewSlidingWindow (the weighted estimate of
// slidingwindow.New), NewSlidingLog (as slidinglog.New) and NewConcurrency
// (slots held with a lease that runs out, so a crashed holder frees its
// slots; as counting.New otherwise).
//
// # How a decision is made
//
// Each decision is one Lua script run atomically by Redis in one round
// trip: it is loaded once and called by EVALSHA, and sent again
// transparently when Redis answers NOSCRIPT (after SCRIPT FLUSH, a restart
// or a failover). Concurrent decisions of one limiter share round trips: a
// lone call goes out at once, and calls that arrive while one is in
// flight are sent together as one pipeline when it returns (each is still
// its own atomic script). The clock is Redis's TIME, so clocks of the clients do
// not matter; with throttle.WithClock (through WithOptions) the injected
// time is passed to the script instead, which is how the tests compare
// these limiters with the local ones on virtual time.
//
// Scripts compute in Lua numbers (doubles) on offsets from a reference
// instant sent by the client, never on absolute nanoseconds, so decisions
// are exact to the nanosecond for spans up to 2^52 ns (52 days): windows
// are bounded by 52 days, bucket spans (burst × interval) by 2^52 ns
// (a longer one is refused at construction), and reservations book at
// most 2^52 ns ahead.
//
// # Keys
//
// The state of a limiter key lives under "throttle:" + algorithm + "(" +
// configuration + "):" + key, so that two limiters of one algorithm and
// different limits never share a key's state by accident (limiters of the
// same algorithm and limit do), or, with WithPrefix(p), under p +
// algorithm + ":" + key, for limiters that share state on purpose. Keys
// have a TTL so idle keys vanish from Redis. Every script touches one key, or two keys sharing a hash
// tag (the sliding log: the key itself, or a hash of it when it has
// braces), so it works on Redis Cluster for any key; any go-redis v9
// UniversalClient will do (standalone, Sentinel, Cluster, Ring).
//
// # "Once every d" and reservations
//
// NewTokenBucket(rdb, throttle.Every(d), 1) admits permits at least d apart
// across every process.
// Reserve books the next free permit and returns the wait (optimistic
// mode; throttle.Wait does this), bounded by maxWait: beyond maxWait/d
// permits booked ahead, the caller is told to back off. Allow never
// books (pessimistic mode: back off for RetryAfter with jitter, as
// throttle.Wait with throttle.Pessimistic does). A booked permit that is
// not used at its instant is wasted, never carried over: the state is
// the next free instant, which idle time never moves back.
//
// # Failures
//
// Each call is bounded by WithTimeout (default 100 ms). When
// Redis fails or is too slow, the failure policy applies: failsafe.Closed (the
// default) denies with an error wrapping throttle.ErrUnavailable, failsafe.Open
// admits, failsafe.Fallback asks a local limiter (WithFallback; e.g. the limit
// divided by the number of instances). A circuit breaker (WithBreaker)
// opens after consecutive failures, so that a dead Redis costs
// microseconds per call instead of a timeout, and lets one probe through
// per cooldown.
//
// Errors are classified by Redis's error code, not by the key they
// name: out of memory (OOM under noeviction), a read-only replica
// (READONLY), MASTERDOWN, LOADING, BUSY, CLUSTERDOWN, TRYAGAIN and every
// other error reply are the server's state, so they are failures like a
// timeout: the policy answers, the breaker counts them. Only a key of
// another type (WRONGTYPE) or a value the scripts' own validation rejects
// (written by something else) is that key's failure, not an outage: its
// calls fail with an error wrapping throttle.ErrInvalid that names the
// Redis key to delete, no policy admits it, and the breaker and the other
// keys are unaffected.
//
// WithObserver reports the breaker opening and closing, the requests the
// failure policy decided while Redis was unavailable, and warnings.
//
// # Failover
//
// With Sentinel (a go-redis failover client) or Cluster, a failed master
// is replaced by a replica, and two bounds apply to what the limit then
// admits over the failover:
//
//   - Redis replicates asynchronously: admissions the old master made in
//     its last moments that had not reached the promoted replica are
//     forgotten, and admitted again. A reproduction admitted 15 requests
//     of a 10/hour limit. The excess is at most what was admitted in the
//     replication lag before the failure (the replica's lag, usually
//     milliseconds, up to the failover's detection time when the link
//     was down). WithReplicas(n, timeout) closes this gap: each decision
//     is answered only once n replicas acknowledged it (WAIT), so a
//     failover to one of them forgets no answered admission; a decision
//     not acknowledged in time fails and goes to the failure policy.
//   - Decisions read the server's clock (TIME). A promoted replica whose
//     clock is Δ ahead of the old master's sees every bucket Δ later:
//     it admits up to rate·Δ more (and a window limiter may start a new
//     window early); a clock Δ behind admits less for Δ. Keep the
//     servers' clocks synchronized (NTP); the bound is the skew between
//     any two servers that may be master.
//
// The limiters of this package do not fail over by themselves: the
// go-redis client does (NewFailoverClient, NewClusterClient), and calls
// made during the switch fail and go to the failure policy.
//
// WithReplicas costs a WAIT per round trip (concurrent decisions share
// one), which waits for a replica's acknowledgement: on loopback with one
// replica (BenchmarkReplicas, medians of 8 on a busy 2-core machine), one
// caller made 6.4k decisions/s instead of 13.9k, and 16 concurrent
// callers 43k instead of 56k.
//
// # Memory and eviction
//
// A limiter key that Redis evicts comes back empty, and the next requests
// are admitted as if nothing had been used: run the server with
// maxmemory-policy noeviction (the default), or with memory enough never
// to evict. Every limiter key carries a TTL, so volatile-* policies evict
// them as readily as allkeys-* do. On its first answered call a limiter
// reads the server's maxmemory settings (CONFIG GET, skipped where the
// command is disabled) and, when eviction is possible, warns through
// WithObserver (an EventWarning).
//
// # Token leasing
//
// With WithLeasing, a token bucket takes a batch of tokens per round trip
// and spends them locally, refilling in the background; most decisions
// then need no network. Every leased token is taken from the shared
// bucket; the worst-case overshoot over any interval is stated on
// WithLeasing (at most 2·maxBatch units per process, and at most the
// units the rate earns in maxAge).
package redislimit
