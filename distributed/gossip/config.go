package gossip

import (
	"fmt"
	"time"

	"github.com/throttlekit/throttle"
)

// Defaults and bounds of Config.
const (
	defaultInterval = time.Second
	minInterval     = time.Millisecond
	defaultResend   = 1
	DefaultCopies   = 2
	// maxCopies bounds Config.Copies.
	maxCopies = 8
	// MinSecretLen is the shortest shared secret NewNode accepts.
	MinSecretLen = 16
	// defaultMaxRoundBytes is the default of Config.MaxRoundBytes: about
	// 100,000 short keys.
	defaultMaxRoundBytes = 2 << 20
	// maxMaxRoundBytes bounds Config.MaxRoundBytes: a round's datagrams
	// to a peer are numbered in 16 bits, and a round of that many bytes
	// of reports and levels takes at most about 44,000 datagrams, even
	// with the longest node ID and limiter name (a round cut at 65,535
	// datagrams, as acknowledged in full, would lose the rest).
	maxMaxRoundBytes = 16 << 20
)

// Config configures a Node. The zero value of each field except
// Transport and Secret selects its default.
type Config struct {
	// Transport carries the gossip. Nil makes a standalone node that
	// never gossips (useful for a single host, or tests); then Peers must
	// be empty. The node owns the transport and closes it in Close.
	Transport Transport
	// Secret is the shared key that authenticates every datagram with
	// HMAC-SHA256: at least MinSecretLen bytes, the same on every node.
	// It may be empty if the Transport authenticates every datagram
	// itself (it has a method Authenticated() bool that returns true, as
	// a SealedTransport does): the MAC then still binds each datagram to
	// its receiver.
	Secret []byte
	// ID is the address the peers send to and know this node by: it must
	// be the string in their Peers lists. Default Transport.Addr(), which
	// is right for a specific address ("10.0.0.5:7946") but not for a
	// wildcard bind ("0.0.0.0:7946"): set ID then.
	ID string
	// Peers are the addresses of the other nodes (their IDs). Join and
	// Leave change the set at run time.
	Peers []string
	// Membership tells the node who its peers are and when they join,
	// die or leave (a failure detector's dead members leave the
	// spend-cap shares at once), and may set the node's ID and
	// incarnation (Membership.Local). Nil: a StaticMembership of Peers.
	// With a Membership, Peers must be empty. Join and Leave still work.
	Membership Membership
	// Interval is the gossip period: every Interval, aligned on multiples
	// of Interval since the Unix epoch, each node reports its hits to
	// every peer. Default 1 s, at least 1 ms.
	Interval time.Duration
	// SpendCap bounds what each node may admit for a key within one
	// interval to its share, weighted by the demand every node reported,
	// of the tokens left. It bounds the cluster-wide burst close to the
	// configured burst instead of N times it, at the price of denying
	// some requests that an uncapped node would have admitted while
	// tokens sit unused on other nodes (they are not lost: the bucket
	// keeps them).
	SpendCap bool
	// Resend is how many consecutive rounds a changed counter is sent
	// even before the peer acknowledges it. Counters are resent anyway
	// until a peer acknowledges a round it received in full, so this only
	// adds redundancy. Default 1.
	Resend int
	// Copies is how many times each datagram of a round is sent to each
	// peer: all of the round's datagrams once, then all of them again,
	// and so on. Counters are cumulative, so a duplicate costs bytes, not
	// accuracy; a round then reaches a peer unless every copy is lost,
	// which makes convergence after a loss and the spend cap's view of
	// the other nodes much less sensitive to packet loss. Traffic grows
	// in proportion. 1 sends each datagram once. Default DefaultCopies,
	// at most 8.
	Copies int
	// MaxRoundBytes bounds the report entries (keys and counters) one
	// round sends each peer, before copies. Counters that do not fit go
	// in later rounds, those pending longest first, and a peer's
	// acknowledgement of a cut round covers only what it carried: nothing
	// is lost, it arrives later. The bound adapts to each peer, like TCP's
	// congestion window: halved (down to one datagram) while a peer
	// acknowledges no round, raised by 8 datagrams a round, up to
	// MaxRoundBytes, while it does; so a round too large for a peer's receive buffer, which would
	// otherwise be lost again every round, shrinks until it gets through.
	// It also keeps a flood of new keys from overrunning the peers.
	// Default 2 MiB, at least MaxPacket, at most 16 MiB (a round's
	// datagrams to a peer are numbered in 16 bits).
	MaxRoundBytes int
}

// setDefaults sets the zero fields of cfg that have a default.
func (cfg *Config) setDefaults() {
	if cfg.Interval == 0 {
		cfg.Interval = defaultInterval
	}
	if cfg.Resend == 0 {
		cfg.Resend = defaultResend
	}
	if cfg.Copies == 0 {
		cfg.Copies = DefaultCopies
	}
	if cfg.MaxRoundBytes == 0 {
		cfg.MaxRoundBytes = defaultMaxRoundBytes
	}
}

// check returns an error wrapping throttle.ErrInvalid if cfg, its
// defaults set, is not valid.
func (cfg *Config) check() error {
	switch {
	case cfg.Interval < minInterval:
		return fmt.Errorf("%w: gossip interval %v is below %v", throttle.ErrInvalid, cfg.Interval, minInterval)
	case cfg.Resend < 1 || cfg.Resend > 1000:
		return fmt.Errorf("%w: Resend %d out of [1, 1000]", throttle.ErrInvalid, cfg.Resend)
	case cfg.MaxRoundBytes < MaxPacket || cfg.MaxRoundBytes > maxMaxRoundBytes:
		return fmt.Errorf("%w: MaxRoundBytes %d out of [%d, %d]", throttle.ErrInvalid, cfg.MaxRoundBytes, MaxPacket, maxMaxRoundBytes)
	case cfg.Copies < 1 || cfg.Copies > maxCopies:
		return fmt.Errorf("%w: Copies %d out of [1, %d]", throttle.ErrInvalid, cfg.Copies, maxCopies)
	case cfg.Transport == nil && len(cfg.Peers) > 0:
		return fmt.Errorf("%w: peers need a Transport", throttle.ErrInvalid)
	case cfg.Membership != nil && len(cfg.Peers) > 0:
		return fmt.Errorf("%w: Peers and a Membership: list the peers in the Membership", throttle.ErrInvalid)
	case cfg.Transport != nil && len(cfg.Secret) < MinSecretLen && (len(cfg.Secret) > 0 || !authenticated(cfg.Transport)):
		return fmt.Errorf("%w: gossip secret must be at least %d bytes", throttle.ErrInvalid, MinSecretLen)
	}
	return nil
}

// authenticated reports whether tr authenticates the datagrams it
// delivers (see Config.Secret).
func authenticated(tr Transport) bool {
	a, ok := tr.(interface{ Authenticated() bool })
	return ok && a.Authenticated()
}
