package keyed

import (
	"math/bits"
)

// idOf, the second hash a slot keeps to tell keys apart.

// idOf returns key's second hash, the one a slot keeps to tell keys
// apart; never 0, which find takes for "not computed yet". It is a seeded
// multiply-fold over the key's 8-byte words, a third of maphash's cost
// on short keys: it only has to tell apart keys whose maphash already
// matched.
func idOf(seed uint64, key string) uint64 {
	h := seed ^ uint64(len(key))*k0
	for len(key) > 8 {
		h = fold(h^word(key), k1)
		key = key[8:]
	}
	var t uint64 // the last 1 to 8 bytes
	for i := len(key) - 1; i >= 0; i-- {
		t = t<<8 | uint64(key[i])
	}
	return fold(fold(h^t, k2), k3) | 1
}

// Odd constants with well-mixed bits, for idOf.
const (
	k0 = 0xa0761d6478bd642f
	k1 = 0xe7037ed1a0b428db
	k2 = 0x8ebc6af09c88c6e3
	k3 = 0x589965cc75374cc3
)

// fold returns the high and low halves of a·b folded together.
func fold(a, b uint64) uint64 {
	hi, lo := bits.Mul64(a, b)
	return hi ^ lo
}

// word returns the first 8 bytes of s, little-endian.
func word(s string) uint64 {
	_ = s[7]
	return uint64(s[0]) | uint64(s[1])<<8 | uint64(s[2])<<16 | uint64(s[3])<<24 |
		uint64(s[4])<<32 | uint64(s[5])<<40 | uint64(s[6])<<48 | uint64(s[7])<<56
}
