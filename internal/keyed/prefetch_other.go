//go:build !amd64 && !arm64

package keyed

import "unsafe"

// prefetch does nothing on this architecture.
func prefetch(unsafe.Pointer) {}
