package gossip

import (
	"bytes"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/throttlekit/throttle"
)

// Keyring holds the AES keys (16, 24 or 32 bytes) of a SealedTransport.
// *memberlist.Keyring implements it, so a cluster rotates one keyring for
// its membership and its counters. Implementations must be safe for
// concurrent use, and must not modify a slice they returned.
type Keyring interface {
	// GetPrimaryKey returns the key datagrams are sealed with.
	GetPrimaryKey() []byte
	// GetKeys returns every key a datagram may be sealed with, the
	// primary first.
	GetKeys() [][]byte
}

// sealOverhead is what a SealedTransport adds to each datagram: a
// version byte, a 12-byte nonce and a 16-byte authentication tag. A
// sealed datagram is at most MaxPacket+sealOverhead bytes, which still
// fits an Ethernet MTU.
const sealOverhead = 1 + 12 + 16

const sealVersion = 1

// sealLabel is the additional data of every sealed datagram: it keeps
// them from being taken for another protocol's under the same key.
var sealLabel = []byte("throttle gossip v1")

// errNoKey is returned by Seal when the keyring's primary key is not a
// usable AES key.
var errNoKey = fmt.Errorf("%w: gossip: keyring has no AES key (16, 24 or 32 bytes) as primary", throttle.ErrInvalid)

// SealedTransport encrypts and authenticates every datagram of another
// Transport with AES-GCM: sealed with the keyring's primary key, opened
// with any of its keys, so keys rotate without a restart (add the new key
// on every node, make it primary on every node, then remove the old one).
// Datagrams that open under no key are dropped and counted (Refused).
// A node on a SealedTransport needs no Config.Secret: the seal
// authenticates, and the node still binds each datagram to its receiver
// and refuses replays.
//
// Nonces are random, so a key should seal fewer than 2^32 datagrams
// across the cluster: rotate it before. Create it with Seal; it is safe
// for concurrent use.
type SealedTransport struct {
	inner   Transport
	keys    Keyring
	aeads   atomic.Pointer[[]keyAEAD] // the keyring's keys at the last change
	refused atomic.Uint64
}

type keyAEAD struct {
	key  []byte
	aead cipher.AEAD // nil if key is not an AES key
}

// Seal returns tr with every datagram sealed under keys. Closing it closes
// tr. The error wraps throttle.ErrInvalid.
func Seal(tr Transport, keys Keyring) (*SealedTransport, error) {
	s := &SealedTransport{inner: tr, keys: keys}
	if s.ring()[0].aead == nil {
		return nil, errNoKey
	}
	return s, nil
}

// ring returns the keyring's keys, primary first, with their ciphers,
// made again only when the keys changed. It is never empty.
func (s *SealedTransport) ring() []keyAEAD {
	keys := s.keys.GetKeys()
	if len(keys) == 0 {
		keys = [][]byte{nil}
	}
	if c := s.aeads.Load(); c != nil && len(*c) == len(keys) {
		same := true
		for i, k := range keys {
			same = same && bytes.Equal((*c)[i].key, k)
		}
		if same {
			return *c
		}
	}
	ring := make([]keyAEAD, len(keys))
	for i, k := range keys {
		ring[i].key = bytes.Clone(k)
		if b, err := aes.NewCipher(k); err == nil {
			ring[i].aead, _ = cipher.NewGCM(b)
		}
	}
	s.aeads.Store(&ring)
	return ring
}

// Addr returns the inner transport's address.
func (s *SealedTransport) Addr() string { return s.inner.Addr() }

// Send seals p with the primary key and sends it. The error wraps throttle.ErrInvalid
// if the primary key is not an AES key.
func (s *SealedTransport) Send(addr string, p []byte) error {
	a := s.ring()[0].aead
	if a == nil {
		return errNoKey
	}
	out := make([]byte, 1+a.NonceSize(), 1+a.NonceSize()+len(p)+a.Overhead())
	out[0] = sealVersion
	rand.Read(out[1:])
	out = a.Seal(out, out[1:], p, sealLabel)
	return s.inner.Send(addr, out)
}

// Listen delivers to h the datagrams that open under a key of the ring.
func (s *SealedTransport) Listen(h func(p []byte, from string)) error {
	return s.inner.Listen(func(p []byte, from string) {
		if pt, err := s.open(p); err == nil {
			h(pt, from)
			return
		}
		s.refused.Add(1)
	})
}

var errUnsealed = errors.New("gossip: datagram not sealed under a key of the ring")

func (s *SealedTransport) open(p []byte) ([]byte, error) {
	if len(p) < sealOverhead || p[0] != sealVersion {
		return nil, errUnsealed
	}
	nonce, ct := p[1:13], p[13:]
	for _, k := range s.ring() {
		if k.aead == nil {
			continue
		}
		if pt, err := k.aead.Open(nil, nonce, ct, sealLabel); err == nil {
			return pt, nil
		}
	}
	return nil, errUnsealed
}

// Refused returns how many datagrams were dropped because they opened
// under no key of the ring: forged, corrupted, sealed under a key removed
// or not yet added, or not sealed at all.
func (s *SealedTransport) Refused() uint64 { return s.refused.Load() }

// Authenticated reports that the transport authenticates every datagram
// it delivers, so a Node on it needs no Config.Secret.
func (s *SealedTransport) Authenticated() bool { return true }

// Close closes the inner transport.
func (s *SealedTransport) Close() error { return s.inner.Close() }

// matchAddr defers the source check to the inner transport.
func (s *SealedTransport) matchAddr(peer, from string) bool {
	if m, ok := s.inner.(interface{ matchAddr(peer, from string) bool }); ok {
		return m.matchAddr(peer, from)
	}
	return peer == from
}
