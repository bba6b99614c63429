package daemon

import (
	"io"
	"sync"

	"github.com/throttlekit/throttle/distributed/gossip"
)

// Members configures membership by a failure detector (SWIM, as
// hashicorp/memberlist runs it) instead of a static gossip.peers list:
// daemons join through seeds, and a dead one leaves the shares at once.
// The daemon runs none itself: Gossip.Membership starts it (cmd/throttled
// runs memberlist).
type Members struct {
	// Bind is the membership's own address (TCP and UDP), e.g.
	// "0.0.0.0:7947"; not the gossip port.
	Bind string `json:"bind"`
	// Advertise is the address the others reach the membership at when
	// Bind is a wildcard.
	Advertise string `json:"advertise,omitempty"`
	// Seeds are membership addresses of daemons to join through,
	// host:port; a DNS name stands for every address it resolves to, at
	// each join.
	Seeds []string `json:"seeds,omitempty"`
	// Rejoin is how often seeds no member answers at are joined again
	// (default 10s).
	Rejoin Duration `json:"rejoin,omitempty"`
}

// A MembershipFunc starts the membership of g.Members for the gossip node
// with the given ID, encrypting its traffic under keys (nil without
// gossip.key_file). The daemon closes the returned Closer after the node
// at Shutdown.
type MembershipFunc func(g Gossip, id string, keys [][]byte) (gossip.Membership, io.Closer, error)

// keyring is the gossip.Keyring of gossip.key_file, replaced whole when
// the file is read again.
type keyring struct {
	mu   sync.Mutex
	keys [][]byte
}

func (k *keyring) GetPrimaryKey() []byte { k.mu.Lock(); defer k.mu.Unlock(); return k.keys[0] }
func (k *keyring) GetKeys() [][]byte     { k.mu.Lock(); defer k.mu.Unlock(); return k.keys }
func (k *keyring) set(keys [][]byte)     { k.mu.Lock(); k.keys = keys; k.mu.Unlock() }
