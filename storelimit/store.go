package storelimit

import (
	"context"

	"github.com/throttlekit/throttle"
)

// Algorithm is a limit's decision as a pure function of one key's state,
// an int64: what a Store-backed limiter runs in Go over state kept
// elsewhere (a SQL row, a Memcached item). tokenbucket, leakybucket,
// fixedwindow and slidingwindow (the weighted form) have one; a limit whose
// state does not fit one word (the sliding log's timestamps, the slotted
// window's ring, held units that must be released) has none.
//
// An Algorithm is immutable and safe for concurrent use.
type Algorithm interface {
	// Decide decides n units at now (nanoseconds since the Unix epoch)
	// on a key whose state is state. It returns the state to store (state
	// itself when denied) and the Decision. A state past the Decision's
	// ResetAfter decides as Fresh does. Errors wrap throttle.ErrInvalid or
	// throttle.ErrExceedsLimit.
	Decide(state, now int64, n int) (next int64, d throttle.Decision, err error)
	// Fresh returns the state of a key never seen.
	Fresh() int64
	// Quota states the limit.
	Quota() throttle.Quota
}

// Store keeps one int64 state per key, each live until an instant, for a
// Limiter, which decides with an Algorithm: it reads
// the state, decides in Go, and writes the next state back only if the
// stored one is still the state read, else reads and decides again. A
// denial writes nothing.
//
// Instants are nanoseconds since the Unix epoch on the caller's clock,
// passed in as now: a Store reads no clock of its own, so a state is live
// exactly while the limiter that wrote it says so. A key with no state,
// or whose state expired before now, has state 0; the limiter maps
// 0 to its Algorithm's fresh state, so a stored 0 and no state are the
// same thing and a Store may drop either. A Store may keep a state past
// its expiry (rounding expires up to its own resolution, sweeping late):
// a state past its expiry decides as a fresh one. It must never drop a
// state before.
//
// Implementations must be safe for concurrent use, and each method must be
// atomic with respect to the others on the same key across every process
// sharing the store. Errors are failures of the store; the limiter wraps
// them in throttle.ErrUnavailable.
type Store interface {
	// Load returns key's state at now.
	Load(ctx context.Context, key string, now int64) (state int64, err error)
	// CompareAndSwap sets key's state to next, live until expires
	// (inclusive), if its state at now is old, and reports whether it did.
	CompareAndSwap(ctx context.Context, key string, old, next, now, expires int64) (swapped bool, err error)
}

// LoadingStore is a Store whose compare-and-swap also returns the key's
// state when it does not swap. A Limiter then decides on the state it last saw of a key, without
// reading it first: an admission whose guess holds takes one call to the
// store, and one that does not learns the state from the failed swap.
type LoadingStore interface {
	Store
	// CompareAndSwapLoad is CompareAndSwap that, when it does not swap,
	// returns key's state at now (as Load would; a state written by a
	// racing writer just before may be missed, costing the caller one
	// more try).
	CompareAndSwapLoad(ctx context.Context, key string, old, next, now, expires int64) (state int64, swapped bool, err error)
}

// BatchStore is a LoadingStore that also swaps the states of many keys in
// one call (for a SQL table, one statement, one round trip and one
// commit). A Limiter over one sends the swaps of its concurrent decisions
// on different keys that are waiting at the same moment as one batch,
// while other calls of it are at the store; a lone swap goes at once, by
// CompareAndSwapLoad.
type BatchStore interface {
	LoadingStore
	// CompareAndSwapBatch does each swap of swaps as CompareAndSwapLoad
	// would (each on its own key at its own Now: the keys of one call
	// are distinct), setting its Swapped and State, or its Err when that
	// key alone failed; the others are unaffected. An error returned
	// fails every swap of the call. It must be atomic per key as
	// CompareAndSwapLoad is, and safe for concurrent use; the swaps of
	// one call need not be atomic together.
	CompareAndSwapBatch(ctx context.Context, swaps []Swap) error
}

// Swap is one key's compare-and-swap in a call of
// BatchStore.CompareAndSwapBatch: set Key's state to Next, live until
// Expires, if its state at Now is Old. The store sets Swapped, State (the
// key's state at Now when it did not swap) and Err. It is a plain value,
// owned by the call it is passed to until that returns; the zero Swap
// swaps the empty key from no state to none.
type Swap struct {
	Key                     string
	Old, Next, Now, Expires int64
	State                   int64
	Swapped                 bool
	Err                     error
}
