//go:build amd64 || arm64

package keyed

import "unsafe"

// prefetch asks the processor to start loading the cache line at p and
// returns at once: the load goes on while the caller reads the clock.
// Unlike a plain load, a prefetch is not one the clock's read waits for.
//
//go:noescape
func prefetch(p unsafe.Pointer)
