package envoyrls

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/distributed/gossip"
)

// Fleet is the Backend of several service instances without a store,
// on their gossip nodes (package gossip, and its guarantees). With
// all-to-all routing (the default) each decides locally on a
// gossip.Limiter and is charged, one gossip interval later, for what the
// others admitted: with the node's spend cap, at most burst + rate·d +
// N-1 in any window d across N nodes. With owner routing
// (FleetOptions.Owner) each key is decided by its owner node, exact, for
// a round trip per descriptor whose key another node owns.
// Every rule runs as a token bucket of requests_per_unit per unit and
// burst (default requests_per_unit), whatever its algorithm: a fleet
// does not reproduce the reference's fixed windows. A rule of 0 requests
// refuses everything. Every node must run the same rules. Safe for
// concurrent use; Close closes the limiters it made, not the node.
type Fleet struct {
	node     *gossip.Node
	o        FleetOptions
	mu       sync.Mutex // serializes the creation of limiters
	limiters sync.Map   // limiterSpec → *gossip.Limiter or *gossip.OwnedLimiter
}

// FleetOptions choose the routing; every node must have the same.
type FleetOptions struct {
	// Owner decides each key on its owner node (gossip.OwnedLimiter)
	// with the forwarding settings of Owned.
	Owner bool
	Owned gossip.OwnedConfig
}

// NewFleet decides on node's limiters.
func NewFleet(node *gossip.Node, o FleetOptions) *Fleet { return &Fleet{node: node, o: o} }

// charge implements Backend.
func (f *Fleet) charge(ctx context.Context, _ time.Time, hits []hit, out []outcome) error {
	for i, h := range hits {
		if h.Limit.RequestsPerUnit == 0 {
			out[i] = outcome{Over: true, Reset: h.Limit.rlUnit.Period()}
			continue
		}
		o, err := allowHit(ctx, h, f.limiter)
		if err != nil {
			return err
		}
		out[i] = o
	}
	return nil
}

// limiter returns the node's limiter of l's rate and burst, gossiped
// under a name made of them, so that every node finds the same one.
func (f *Fleet) limiter(l *limitRule) (throttle.Limiter, error) {
	s := limiterSpec{alg: tokenBucket, rpu: l.RequestsPerUnit, unit: l.rlUnit, burst: cmpOr(l.Burst, l.RequestsPerUnit)}
	if v, ok := f.limiters.Load(s); ok {
		return v.(throttle.Limiter), nil
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if v, ok := f.limiters.Load(s); ok {
		return v.(throttle.Limiter), nil
	}
	name := fmt.Sprintf("rls:%d/%ds:%d", s.rpu, s.unit.Seconds(), s.burst)
	rate, burst := throttle.NewRate(int(s.rpu), s.unit.Period()), int(s.burst)
	var lim throttle.Limiter
	var err error
	if f.o.Owner {
		lim, err = f.node.NewOwnedLimiter(name, rate, burst, f.o.Owned)
	} else {
		lim, err = f.node.NewLimiter(name, rate, burst)
	}
	if err != nil {
		return nil, err
	}
	f.limiters.Store(s, lim)
	return lim, nil
}

// Close closes the limiters the fleet made.
func (f *Fleet) Close() error {
	f.limiters.Range(func(k, v any) bool {
		closeLimiter(v.(throttle.Limiter))
		f.limiters.Delete(k)
		return true
	})
	return nil
}
