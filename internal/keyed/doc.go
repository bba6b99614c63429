// Package keyed is the concurrent key → state map that every keyed limiter
// in this module stores its per-key state in.
//
// Each shard (256 at the default size) is an open-addressing table whose
// slots hold the per-key states themselves: a decision on a key touches
// the key's slot and nothing else, a few dozen bytes (across two adjacent
// cache lines at worst). Reads take no
// lock: readers probe the table while writers, serialized by the shard's
// mutex, publish into it; the algorithm updates the state in its slot with
// atomics.
//
// A slot does not hold its key. It holds the key's 64-bit seeded hash
// (less two bits of bookkeeping) and a second, independently seeded 64-bit
// hash (less one bit): a look-up matches both. Two keys share one state
// only if both collide: with a million keys, a chance near 10^-26 (125
// bits), and keys chosen by an attacker who does not know the seeds fare
// no better. Sharing would only ever deny more, never admit more.
//
// Memory is bounded two ways:
//
//   - a key whose state is back to full is dropped (no accuracy is lost:
//     a fresh state is the same as a full one). Idle keys are found lazily,
//     a few slots per insert, and by Sweep or the optional sweeper;
//   - a hard cap (Settings.MaxKeys) on the keys of the whole map, counted
//     in one atomic: inserting past it evicts a key chosen by the CLOCK
//     approximation of least-recently-used, from the inserting key's
//     shard or, when that has none to give, from another shard whose lock
//     is free. Evicting a key that was not full forgets its state (or
//     leaves its debt, see SetDebts); Evictions counts those.
//
// Removal never races with a decision. The map retires a state (State.Retire
// marks it dead with the algorithm's own compare-and-swap of the exact word
// it judged) before it drops the key, and a decision that finds its state
// dead looks the key up again (Again). Growing or rebuilding a table moves
// every state to the new table the same way: State.Move marks the old one
// dead as it copies it. A state is judged idle against a clock reading
// taken after its word was loaded (Judge.Now), so a word written by a
// decision that read the clock later than the clean-up is never judged
// from the past. And each shard records the latest instant its clean-up
// judged from: a decision whose own clock reading is older is lifted to that
// instant when it looks its key up (Get), so one held up between its clock
// reading and its look-up cannot count in a fresh state "before" the
// instant at which the dropped one was judged idle.
package keyed
