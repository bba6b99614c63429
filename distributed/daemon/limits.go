package daemon

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/throttlekit/throttle"
)

// The limiters of a configuration: which limit a tag matches, and the
// usage a changed limit carries over from the configurations before.

// limits are the limiters of one configuration, swapped whole by Reload.
type limits struct {
	exact map[string]bucketLimiter // rules without wildcards
	globs []globRule
	def   bucketLimiter
	all   map[string]bucketLimiter // by gossip name
	burst map[bucketLimiter]int64
	owned bool // routing "owner": the limiters are *gossip.OwnedLimiter
	// prev is the configuration this one replaced, while a changed
	// limit's tags may still carry usage from it (see carry); nil after.
	prev atomic.Pointer[limits]
}

// maxCarry bounds how long a reload keeps the replaced limiters to carry
// their usage over: a bucket refills in burst/rate at most, and usage
// older than this is forgotten.
const maxCarry = 10 * time.Minute

type globRule struct {
	pattern string
	lim     bucketLimiter
}

// limitName is the gossip name of a limit: its rate and burst are part
// of it, so that daemons whose configurations differ do not charge each
// other, and a reload that changes a limit starts a new one.
func limitName(kind string, l Limit) string {
	return fmt.Sprintf("%s|%s|%d", kind, l.Rate, l.Burst)
}

// buildLimits makes the limiters of cfg, reusing those of old whose name
// (kind, rate and burst) is unchanged.
func (s *Server) buildLimits(cfg Config, old *limits) (*limits, error) {
	l := &limits{exact: map[string]bucketLimiter{}, all: map[string]bucketLimiter{}, burst: map[bucketLimiter]int64{},
		owned: cfg.Gossip.Routing == routingOwner}
	var created []bucketLimiter
	newLim := func(kind string, lm Limit) (bucketLimiter, error) {
		name := limitName(kind, lm)
		if x := l.all[name]; x != nil {
			return x, nil
		}
		// Unchanged since the running configuration, or one before it
		// still open to carry usage: the same buckets.
		for o := old; o != nil; o = o.prev.Load() {
			if x := o.all[name]; x != nil {
				l.all[name], l.burst[x] = x, int64(lm.Burst)
				return x, nil
			}
		}
		r, err := throttle.ParseRate(lm.Rate)
		if err != nil {
			return nil, err
		}
		x, err := s.newLimiter(cfg.Gossip, name, r, lm.Burst)
		if err != nil {
			return nil, err
		}
		created = append(created, x)
		l.all[name], l.burst[x] = x, int64(lm.Burst)
		return x, nil
	}
	fail := func(err error) (*limits, error) {
		for _, x := range created {
			x.Close()
		}
		return nil, err
	}
	var err error
	if l.def, err = newLim("default", cfg.Default); err != nil {
		return fail(err)
	}
	for _, r := range cfg.Rules {
		lim, err := newLim("rule:"+r.Pattern, r.Limit)
		if err != nil {
			return fail(fmt.Errorf("rule %q: %w", r.Pattern, err))
		}
		if isLiteral(r.Pattern) {
			if _, dup := l.exact[r.Pattern]; !dup {
				l.exact[r.Pattern] = lim
			}
		} else {
			l.globs = append(l.globs, globRule{r.Pattern, lim})
		}
	}
	return l, nil
}

// limitRate returns the rate of x, from its gossip name (see limitName).
func limitRate(x bucketLimiter) string {
	name := x.Name()
	for i := len(name) - 1; i >= 0; i-- {
		if name[i] == '|' {
			name = name[:i]
			break
		}
	}
	for i := len(name) - 1; i >= 0; i-- {
		if name[i] == '|' {
			return name[i+1:]
		}
	}
	return ""
}

func isLiteral(p string) bool {
	for i := 0; i < len(p); i++ {
		if p[i] == '*' || p[i] == '?' {
			return false
		}
	}
	return true
}

func (s *Server) limiter(tag []byte) bucketLimiter { return s.lim.Load().limiter(tag) }

// carry keeps the usage key had under the configurations before l, when
// its limit changed: before each decision, while they are kept, lim's
// bucket is brought down to at most the tokens l.tokens allows. Racing
// decisions may each charge: stricter, never looser. It costs one atomic
// load when l carries nothing. With routing "owner" nothing is carried: a
// tag whose limit changed starts on a full bucket of the new limit.
func (l *limits) carry(lim bucketLimiter, key string) {
	if l.prev.Load() == nil || l.owned {
		return // an owner-routed tag's bucket is on its owner
	}
	have := lim.Tokens(key)
	if k := have - max(l.tokens(lim, key, maxChain), 0); k > 0 {
		lim.Allow(context.Background(), key, int(min(k, have)))
	}
}

// tokens returns the tokens key may have in lim, its limiter under l:
// those of its bucket, at most lim's burst less what key's bucket had
// used under the previous configuration (itself so bounded, depth
// configurations back). The old buckets refill at their old rates, so
// carried usage fades as it would have.
func (l *limits) tokens(lim bucketLimiter, key string, depth int) int64 {
	have := lim.Tokens(key)
	p := l.prev.Load()
	if p == nil || depth == 0 {
		return have
	}
	old := p.limiter([]byte(key))
	if old == lim {
		return min(have, p.tokens(old, key, depth-1))
	}
	used := p.burst[old] - p.tokens(old, key, depth-1)
	return min(have, l.burst[lim]-used)
}

func (l *limits) limiter(tag []byte) bucketLimiter {
	if x, ok := l.exact[string(tag)]; ok {
		return x
	}
	for _, g := range l.globs {
		if match(g.pattern, tag) {
			return g.lim
		}
	}
	return l.def
}
