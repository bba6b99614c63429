package main

import (
	"bytes"
	"io"
	"log/slog"
	"sync"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/throttlekit/throttle/distributed/daemon"
	"github.com/throttlekit/throttle/distributed/gossip"
	"github.com/throttlekit/throttle/distributed/gossip/gossipmember"
)

// members runs the membership of gossip.members on memberlist
// (gossipmember), under the keys of gossip.key_file, which rekey installs
// again after a reload.
type members struct {
	log *slog.Logger

	mu   sync.Mutex
	ring *memberlist.Keyring // nil without a key file
}

// start is the daemon's MembershipFunc.
func (mb *members) start(g daemon.Gossip, id string, keys [][]byte) (gossip.Membership, io.Closer, error) {
	var ring *memberlist.Keyring
	if keys != nil {
		var err error
		if ring, err = memberlist.NewKeyring(keys, keys[0]); err != nil {
			return nil, nil, err
		}
	}
	mb.mu.Lock()
	mb.ring = ring
	mb.mu.Unlock()
	m, err := gossipmember.New(gossipmember.Config{
		Bind: g.Members.Bind, Advertise: g.Members.Advertise, GossipAddr: id,
		Seeds: g.Members.Seeds, Rejoin: time.Duration(g.Members.Rejoin), Keyring: ring, Logger: mb.log,
	})
	if err != nil {
		return nil, nil, err
	}
	return m, m, nil
}

// rekey makes memberlist's ring hold keys, keys[0] primary: the new ones
// added first, then the primary moved, then the others removed, so that
// at no step is a key both in use and missing.
func (mb *members) rekey(keys [][]byte) error {
	mb.mu.Lock()
	defer mb.mu.Unlock()
	if mb.ring == nil {
		return nil
	}
	for _, k := range keys {
		if err := mb.ring.AddKey(k); err != nil {
			return err
		}
	}
	if err := mb.ring.UseKey(keys[0]); err != nil {
		return err
	}
	for _, old := range mb.ring.GetKeys() {
		keep := false
		for _, k := range keys {
			keep = keep || bytes.Equal(k, old)
		}
		if !keep {
			if err := mb.ring.RemoveKey(old); err != nil {
				return err
			}
		}
	}
	return nil
}
