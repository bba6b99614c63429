package capacity

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"math"
)

// Verifiable leases. A server that has just become master learns what
// clients hold from what they report (ResourceRequest.Has), and a client
// that claims more than it holds takes capacity another client holds but
// has not reported yet. With lease keys, each grant carries a token
// (Grant.Token): an HMAC-SHA256 under a key the replicas share, over the
// client id, the resource id, the granted capacity, the lease's expiry
// and the master's term. The client sends the token back with Has, and a
// learning server credits Has only up to the capacity of a valid token:
//
//	credited = min(Has, Wants, capacity of the token)   if the token is
//	           valid: made with one of the keys, for this client and
//	           this resource, and not expired on the server's clock;
//	credited = 0                                         otherwise.
//
// A claim without a valid token counts as 0 whatever other clients show,
// so that a liar gains nothing by reporting first. Outside learning Has
// only confirms a lowered lease, and tokens are not needed.
//
// What the keys protect: a client can no longer claim, while a server
// learns, a lease it was not granted, another client's lease, a lease on
// another resource, or a lease that has expired. They do not stop a
// client from claiming a larger lease it was granted earlier and that
// has not expired yet although it was lowered since (at most its largest
// unexpired grant), nor from using more than its lease: clients are still
// trusted to uphold their leases. Expiry is checked on the wall clock of
// the server (Unix time), so replicas' clocks should agree to well within
// a lease; a token outlives its lease by that skew at most.

// MinLeaseKeyLen is the shortest lease key WithLeaseKeys accepts, in bytes.
const MinLeaseKeyLen = 16

// tokenLen is the length of a lease token: version, term, expiry,
// capacity, MAC.
const tokenLen = 1 + 8 + 8 + 8 + sha256.Size

// tokenVersion is the first byte of a lease token.
const tokenVersion = 1

// WithLeaseKeys makes the server sign each grant (Grant.Token) with
// keys[0] and, while it learns, credit what a client says it holds only
// up to a grant signed with any of keys: min(Has, Wants, the token's
// capacity) for a token of this client on this resource that has not
// expired, 0 for a claim without one. All replicas need the same keys.
// To rotate, add the new key last on every replica, then move it first,
// and drop the old one a MaxLeaseLength later. Each key needs at least
// MinLeaseKeyLen bytes (32 random bytes recommended); NewServer refuses
// shorter ones with an error wrapping throttle.ErrInvalid. Without keys
// (the default) a learning server takes clients' word for what they
// hold. Turning keys on costs one learning period: the next master
// confirms leases granted without a token at 0.
func WithLeaseKeys(keys ...[]byte) ServerOption {
	return func(s *serverSettings) {
		s.keys = make(leaseKeys, len(keys))
		for i, k := range keys {
			s.keys[i] = append([]byte(nil), k...)
		}
	}
}

// leaseKeys sign with the first key and verify with any; nil signs
// nothing.
type leaseKeys [][]byte

func (k leaseKeys) check() error {
	for i, key := range k {
		if len(key) < MinLeaseKeyLen {
			return invalidf("lease key %d has %d bytes, at least %d are needed", i, len(key), MinLeaseKeyLen)
		}
	}
	return nil
}

// sign returns the token of a grant of capacity on resource to client,
// expiring at expiry (Unix nanoseconds), by the master of term.
func (k leaseKeys) sign(term int64, client, resource string, capacity float64, expiry int64) []byte {
	if len(k) == 0 {
		return nil
	}
	tok := make([]byte, 0, tokenLen)
	tok = append(tok, tokenVersion)
	tok = binary.BigEndian.AppendUint64(tok, uint64(term))
	tok = binary.BigEndian.AppendUint64(tok, uint64(expiry))
	tok = binary.BigEndian.AppendUint64(tok, math.Float64bits(capacity))
	return append(tok, tokenMAC(k[0], tok, client, resource)...)
}

// credit returns the capacity tok proves that client holds on resource
// at now (Unix nanoseconds), 0 if tok is not a valid, unexpired token of
// client on resource.
func (k leaseKeys) credit(tok []byte, client, resource string, now int64) float64 {
	if len(tok) != tokenLen || tok[0] != tokenVersion {
		return 0
	}
	body, mac := tok[:tokenLen-sha256.Size], tok[tokenLen-sha256.Size:]
	ok := false
	for _, key := range k {
		if hmac.Equal(mac, tokenMAC(key, body, client, resource)) {
			ok = true
			break
		}
	}
	expiry := int64(binary.BigEndian.Uint64(body[9:17]))
	c := math.Float64frombits(binary.BigEndian.Uint64(body[17:25]))
	if !ok || now >= expiry || !(c >= 0) || math.IsInf(c, 0) {
		return 0
	}
	return c
}

// tokenMAC is the MAC of a token's body for client and resource, the ids
// length-prefixed so that no two pairs share an encoding.
func tokenMAC(key, body []byte, client, resource string) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte("throttle.capacity.lease\x00"))
	m.Write(body)
	var n [binary.MaxVarintLen64]byte
	m.Write(n[:binary.PutUvarint(n[:], uint64(len(client)))])
	m.Write([]byte(client))
	m.Write(n[:binary.PutUvarint(n[:], uint64(len(resource)))])
	m.Write([]byte(resource))
	return m.Sum(nil)
}
