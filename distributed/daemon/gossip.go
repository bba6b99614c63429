package daemon

import (
	"cmp"
	"fmt"
	"net"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/distributed/gossip"
	"github.com/throttlekit/throttle/internal/keyfile"
)

// The gossip node of a server: its transport (sealed, from a membership)
// and the warnings about datagrams it drops.

// gossipTransport binds the gossip socket into gc, sealed under the key
// file if there is one, and starts the membership of gossip.members if
// configured.
func (s *Server) gossipTransport(gc *gossip.Config) error {
	g := s.cfg.Gossip
	if err := s.cfg.CheckSecret(); err != nil {
		return err
	}
	if g.Members != nil && g.Membership == nil {
		return fmt.Errorf("%w: gossip.members needs a program that runs a membership (cmd/throttled)", throttle.ErrInvalid)
	}
	gc.Secret, _ = g.secret()
	udp, err := s.listenGossip(g.Listen)
	if err != nil {
		return fmt.Errorf("gossip listen: %w", err)
	}
	gc.Transport = udp
	var keys [][]byte
	if g.KeyFile != "" {
		keys, _ = keyfile.Load(g.KeyFile) // checked by CheckSecret
		s.keys = &keyring{keys: keys}
		if s.seal, err = gossip.Seal(udp, s.keys); err != nil {
			udp.Close()
			return err
		}
		gc.Transport = s.seal
	}
	if g.Members != nil {
		ms, closer, err := g.Membership(g, cmp.Or(g.Advertise, udp.Addr()), keys)
		if err != nil {
			udp.Close()
			return fmt.Errorf("gossip membership: %w", err)
		}
		gc.Membership, s.ms = ms, closer
	}
	return nil
}

// listenGossip binds the gossip transport on addr: UDP, or the test
// hook's.
func (s *Server) listenGossip(addr string) (gossip.Transport, error) {
	if s.cfg.hooks != nil && s.cfg.hooks.gossip != nil {
		return s.cfg.hooks.gossip(addr)
	}
	return gossip.ListenUDP(addr)
}

// hooks replace the sockets of a Server, for simulations in memory.
type hooks struct {
	listen func(network, addr string) (net.Listener, error) // the query listeners
	gossip func(addr string) (gossip.Transport, error)      // the gossip transport
}

// closeMembership stops the membership of gossip.members, if any.
func (s *Server) closeMembership() {
	if s.ms != nil {
		s.ms.Close()
	}
}

func (s *Server) unsealed() uint64 {
	if s.seal == nil {
		return 0
	}
	return s.seal.Refused()
}

// watchGossip logs, loudly, gossip datagrams dropped since the last look,
// with the misconfiguration each cause usually means: a silent gossip is
// a cluster that limits N times too much.
func (s *Server) watchGossip(stop <-chan struct{}, every time.Duration) {
	defer s.wg.Done()
	t := time.NewTicker(every)
	defer t.Stop()
	var last gossip.Stats
	var lastUnsealed uint64
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		g, unsealed := s.node.Stats(), s.unsealed()
		for _, c := range []struct {
			n    uint64
			what string
		}{
			{unsealed - lastUnsealed, "unsealed: opened under no key of gossip.key_file (a key rotation out of order, or forged)"},
			{g.BadMAC - last.BadMAC, "bad_mac: authentication failed (peers with another gossip secret, or forged)"},
			{g.UnknownSender - last.UnknownSender, "unknown_sender: authentic, from a node not in gossip.peers (its advertise address differs from our peers list?)"},
			{g.WrongSource - last.WrongSource, "wrong_source: authentic, from another address than the peer is listed under (NAT, or a wildcard bind sending from another interface?)"},
			{g.Malformed - last.Malformed, "malformed: not a gossip datagram of this version"},
			{g.UnknownTable - last.UnknownTable, "unknown_table: a limit this daemon does not have (rules or limits differ between daemons)"},
			{g.Capped - last.Capped, "capped: peers reported more hits than they could have admitted (limits differ, or a misbehaving peer)"},
		} {
			if c.n > 0 {
				s.log.Warn("gossip datagrams dropped", "count", c.n, "cause", c.what)
			}
		}
		if g.Behind > last.Behind {
			s.log.Warn("gossip rounds cannot carry every changed tag: charges lag the decisions", "rounds", g.Behind-last.Behind,
				"hint", "every hit is still charged (long-run rate exact for tags in steady use), but a tag asked on every daemon before its charges arrive gets up to a burst and the lag's refill on each: use routing \"owner\" for this many active tags")
		}
		if g.PacketsReceived == last.PacketsReceived && len(s.node.Peers()) > 0 && g.Rounds > 10 {
			s.log.Warn("no gossip received from any peer lately", "peers", s.node.Peers(), "advertise", s.node.ID())
		}
		last, lastUnsealed = g, unsealed
	}
}
