package daemon

import (
	"fmt"
	"slices"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/internal/keyfile"
)

// Reload: a new configuration applied to a running server.

// Reload applies the limits (default and rules) and the connection
// settings (max_conns, max_conns_per_addr, idle_timeout, idle_budget,
// write_timeout) of cfg. Buckets of limits whose rate and burst are
// unchanged keep their state. A tag whose limit changed keeps its usage:
// its new bucket holds at most the new burst less what the old bucket has
// used, until the old one has refilled (at most maxCarry; over gossip,
// every node charges the usage it saw, so carried usage may count more
// than once meanwhile: stricter, never looser; with routing "owner"
// nothing is carried).
// Queries racing a reload are answered by the old or the new limits,
// never "ER". New gossip peers are joined, and those no longer listed
// left. Settings that need a restart (listeners, the other gossip settings,
// max_tag_len, max_keys, admin) must be unchanged. If cfg is invalid, the running
// configuration stays and the error wraps throttle.ErrInvalid.
func (s *Server) Reload(cfg Config) error {
	s.relMu.Lock()
	defer s.relMu.Unlock()
	err := s.reload(cfg)
	if err != nil {
		s.st.reloadErrors.Add(1)
		s.log.Error("reload refused, keeping the running configuration", "err", err)
		return err
	}
	s.st.reloads.Add(1)
	s.log.Info("configuration reloaded", "default_rate", cfg.Default.Rate, "default_burst", cfg.Default.Burst, "rules", len(cfg.Rules))
	return nil
}

func (s *Server) reload(cfg Config) error {
	cfg = cfg.WithDefaults()
	if err := cfg.check(); err != nil {
		return err
	}
	fixed := func(c Config) string {
		g := c.Gossip
		g.Interval = 0
		var members Members
		if g.Members != nil {
			members = *g.Members
		}
		return fmt.Sprint(c.Listen, g.Listen, g.Advertise, g.Secret, g.SecretFile, g.SpendCap, g.Copies, g.KeyFile, members, c.MaxTagLen, c.MaxKeys, c.Admin,
			g.Routing, g.ForwardTimeout, g.ForwardDelay, c.StateFile)
	}
	if fixed(cfg) != fixed(s.cfg) || cfg.Gossip.Interval != s.cfg.Gossip.Interval {
		return fmt.Errorf("%w: reload: listen, gossip (but for its peers), max_tag_len, max_keys, admin and state_file need a restart", throttle.ErrInvalid)
	}
	var keys [][]byte
	if cfg.Gossip.KeyFile != "" && s.keys != nil {
		var err error
		if keys, err = keyfile.Load(cfg.Gossip.KeyFile); err != nil {
			return err
		}
	}
	old := s.lim.Load()
	l, err := s.buildLimits(cfg, old)
	if err != nil {
		return err
	}
	if err := s.setPeers(cfg.Gossip.Peers); err != nil {
		return err
	}
	if keys != nil {
		s.keys.set(keys)
	}
	// The previous configurations stay open, in a chain of at most
	// maxChain, while their usage may carry over: for the longest refill
	// time of their limits, at most maxCarry.
	var carry time.Duration
	for _, x := range old.all {
		r, _ := throttle.ParseRate(limitRate(x))
		carry = max(carry, r.Duration(old.burst[x]))
	}
	l.prev.Store(old)
	s.lim.Store(l)
	s.conf.Store(connLimitsOf(cfg))
	o := old
	for range maxChain - 1 {
		if o = o.prev.Load(); o == nil {
			break
		}
	}
	if o != nil {
		s.dropPrev(o)
	}
	time.AfterFunc(min(carry, maxCarry), func() {
		s.relMu.Lock()
		defer s.relMu.Unlock()
		s.dropPrev(l)
	})
	return nil
}

// setPeers makes the gossip node's static peers those listed: it joins
// the new ones and leaves those no longer listed (whose hits stay charged).
// Peers found by memberlist (gossip.members) are its business, not this.
func (s *Server) setPeers(peers []string) error {
	if s.cfg.Gossip.Listen == "" || s.cfg.Gossip.Members != nil {
		return nil
	}
	for _, p := range peers {
		if err := s.node.Join(p); err != nil {
			return err
		}
	}
	for _, p := range s.node.Peers() {
		if !slices.Contains(peers, p) {
			s.node.Leave(p)
		}
	}
	return nil
}

// maxChain bounds the configurations kept to carry usage over reloads.
const maxChain = 16

// dropPrev ends l's carrying of usage: the configurations before l are
// forgotten, and their limiters that the running ones no longer use are
// closed. Called under relMu.
func (s *Server) dropPrev(l *limits) {
	inUse := map[bucketLimiter]bool{}
	for c := s.lim.Load(); c != nil && c != l; c = c.prev.Load() {
		for _, x := range c.all {
			inUse[x] = true
		}
	}
	for _, x := range l.all {
		inUse[x] = true
	}
	for o := l.prev.Swap(nil); o != nil; o = o.prev.Swap(nil) {
		for _, x := range o.all {
			if !inUse[x] {
				x.Close()
			}
		}
	}
}
