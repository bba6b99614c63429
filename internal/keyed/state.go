package keyed

// What the map asks of a per-key state (Retirer, State, Judge), and Box.

// Retirer is what the map asks of a state about dropping it.
type Retirer interface {
	// Retire atomically marks the state dead if it is back to full, or,
	// when force is set, unconditionally (the map is evicting it). It
	// reports whether the state is now dead. Fullness is judged at
	// j.Now(), read after loading the state's word, and the word judged is
	// the one replaced (by compare-and-swap: if it changed, judge again).
	// A state may refuse a forced retirement (return false) when dropping
	// it would be wrong, such as slots still held; the map then looks for
	// another victim.
	Retire(j Judge, force bool) bool
}

// State is implemented by P, a pointer to an algorithm's per-key state,
// which the map keeps inline in its table slots. The zero value of the
// state must mean "fresh, full capacity". A state that must not move (it
// holds a lock or waiters) is kept in a Box.
type State[P any] interface {
	Retirer
	// Move marks the state dead, as Retire does, and copies what it held
	// into dst, a zero state that nobody else sees yet. The map moves
	// every live state when it rebuilds a table, under the shard's lock;
	// decisions that find the old state dead look the key up again.
	Move(dst P)
}

// Judge is the clock a State's Retire judges idleness by.
type Judge interface {
	// Now returns the current time in nanoseconds since the Unix epoch.
	Now() int64
}

// At is a Judge that always reads the same instant: for tests.
type At int64

// Now returns a.
func (a At) Now() int64 { return int64(a) }

// Box keeps a state that must not move (it holds a lock or waiters) on the
// heap, allocated when its key is inserted; the map's slot holds the
// pointer, and moving the slot moves the pointer. Box implements State by
// delegating to the boxed state, and Debtor when Q does.
type Box[T any, Q interface {
	*T
	Retirer
}] struct{ p *T }

// State returns the boxed state.
func (b *Box[T, Q]) State() Q { return b.p }

func (b *Box[T, Q]) fill() { b.p = new(T) }

// Retire implements Retirer by asking the boxed state.
func (b *Box[T, Q]) Retire(j Judge, force bool) bool { return Q(b.p).Retire(j, force) }

// Move implements State: the boxed state itself stays where it is.
func (b *Box[T, Q]) Move(dst *Box[T, Q]) { dst.p = b.p }

// Evict implements Debtor by asking the boxed state, which must implement
// it.
func (b *Box[T, Q]) Evict() int64 { return any(Q(b.p)).(Debtor).Evict() }
