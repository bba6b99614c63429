package daemon

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/distributed/gossip"
)

// bucketLimiter is a limit's limiter: gossiped counters
// (*gossip.Limiter, routing "all") or owner routing
// (*gossip.OwnedLimiter, routing "owner").
type bucketLimiter interface {
	Allow(ctx context.Context, key string, n int) (throttle.Decision, error)
	Tokens(key string) int64
	Name() string
	Close() error
}

// newLimiter returns the limiter of one limit under the routing of g.
func (s *Server) newLimiter(g Gossip, name string, r throttle.Rate, burst int) (bucketLimiter, error) {
	if g.Routing == routingOwner {
		return s.node.NewOwnedLimiter(name, r, burst, gossip.OwnedConfig{Timeout: time.Duration(g.ForwardTimeout),
			Delay: time.Duration(g.ForwardDelay)})
	}
	return s.node.NewLimiter(name, r, burst)
}

// lineAsks are the queries of one read for owner-routed limits, kept
// between reads of a connection to reuse their memory.
type lineAsks struct {
	at []lineAsk // per line
	by map[*gossip.OwnedLimiter][]gossip.Ask
}

// lineAsk is where a line's query went: ask i of lim's, or nowhere (lim
// nil: the line is answered on its own).
type lineAsk struct {
	lim      *gossip.OwnedLimiter
	i        int
	detailed bool
}

// answerLines appends the replies to lines, in order, to dst. The
// queries of owner-routed limits are decided together, each limit's
// forwarded in one batch per owner, so that the lines of one read wait
// for one round trip, not one each.
func (s *Server) answerLines(lines [][]byte, dst []byte, b *lineAsks) []byte {
	l := s.lim.Load()
	if !l.owned {
		for _, line := range lines {
			dst = s.answer(line, dst)
		}
		return dst
	}
	b.collect(l, lines, s.cfg.MaxTagLen)
	b.decide()
	for j, line := range lines {
		a := b.at[j]
		if a.lim == nil {
			dst = s.answer(line, dst)
			continue
		}
		ask := &b.by[a.lim][a.i]
		if errors.Is(ask.Err, throttle.ErrClosed) {
			dst = s.answer(line, dst) // a reload closed the limiter: ask the new one
			continue
		}
		d, ok := s.tally(ask.Decision, ask.Err)
		dst = reply(dst, a.detailed, d, ok)
	}
	for lim, asks := range b.by {
		clear(asks)
		b.by[lim] = asks[:0]
	}
	return dst
}

// decide decides the collected asks, each limiter's together, the
// limiters at the same time: a read waits for one forward timeout at
// most (plus the forward delay), however many limits its lines match,
// not one per limit.
func (b *lineAsks) decide() {
	var wg sync.WaitGroup
	var first *gossip.OwnedLimiter
	for lim, asks := range b.by {
		switch {
		case len(asks) == 0:
		case first == nil:
			first = lim // decided on this goroutine, below
		default:
			wg.Go(func() { lim.AllowMany(context.Background(), asks) })
		}
	}
	if first != nil {
		first.AllowMany(context.Background(), b.by[first])
	}
	wg.Wait()
}

// collect sorts the queries of lines by owned limiter.
func (b *lineAsks) collect(l *limits, lines [][]byte, maxTag int) {
	if b.by == nil {
		b.by = map[*gossip.OwnedLimiter][]gossip.Ask{}
	}
	b.at = b.at[:0]
	for _, line := range lines {
		tag := trimLine(line)
		q, detailed := query(tag)
		lim, _ := l.limiter(q).(*gossip.OwnedLimiter)
		if string(tag) == "PING" || len(q) == 0 || len(q) > maxTag || lim == nil {
			b.at = append(b.at, lineAsk{})
			continue
		}
		b.by[lim] = append(b.by[lim], gossip.Ask{Key: string(q), N: 1})
		b.at = append(b.at, lineAsk{lim: lim, i: len(b.by[lim]) - 1, detailed: detailed})
	}
}

// answer appends the reply to line ("\n" included) to dst.
func (s *Server) answer(line, dst []byte) []byte {
	tag := trimLine(line)
	if string(tag) == "PING" {
		s.st.pings.Add(1)
		return append(dst, replyPong...)
	}
	q, detailed := query(tag)
	d, ok := s.allow(q)
	return reply(dst, detailed, d, ok)
}

// trimLine returns the tag of a line: without "\n" and a "\r" before it.
func trimLine(line []byte) []byte {
	tag := line[:len(line)-1]
	if n := len(tag); n > 0 && tag[n-1] == '\r' {
		tag = tag[:n-1]
	}
	return tag
}

// query returns the tag a line queries, and whether it asks for the
// detailed reply ("?tag").
func query(tag []byte) (q []byte, detailed bool) {
	if len(tag) > 0 && tag[0] == '?' {
		return tag[1:], true
	}
	return tag, false
}

// reply appends the reply to a query decided d (ok false: a bad query):
// "OK\n", "NO\n", "ER\n", or if detailed
// "OK|NO remaining retry_ms reset_ms\n".
func reply(dst []byte, detailed bool, d throttle.Decision, ok bool) []byte {
	switch {
	case !ok:
		return append(dst, replyError...)
	case !detailed && d.Allowed:
		return append(dst, replyOK...)
	case !detailed:
		return append(dst, replyNO...)
	case d.Allowed:
		dst = append(dst, "OK "...)
	default:
		dst = append(dst, "NO "...)
	}
	dst = strconv.AppendInt(dst, int64(d.Remaining), 10)
	dst = append(dst, ' ')
	dst = strconv.AppendInt(dst, ceilMillis(d.RetryAfter), 10)
	dst = append(dst, ' ')
	dst = strconv.AppendInt(dst, ceilMillis(d.ResetAfter), 10)
	return append(dst, '\n')
}

// allow charges tag one token and counts the outcome; ok is false for a
// bad tag.
func (s *Server) allow(tag []byte) (throttle.Decision, bool) {
	if len(tag) == 0 || len(tag) > s.cfg.MaxTagLen {
		s.st.bad.Add(1)
		return throttle.Decision{}, false
	}
	var (
		d   throttle.Decision
		err error
	)
	for {
		l := s.lim.Load()
		lim := l.limiter(tag)
		l.carry(lim, string(tag))
		d, err = lim.Allow(context.Background(), string(tag), 1)
		if !errors.Is(err, throttle.ErrClosed) || s.lim.Load() == l {
			break
		}
		// A reload closed the limiter meanwhile: ask the new one.
	}
	return s.tally(d, err)
}

// tally counts a decision's outcome; ok is false if it failed.
func (s *Server) tally(d throttle.Decision, err error) (throttle.Decision, bool) {
	switch {
	case err != nil:
		s.st.bad.Add(1)
		return d, false
	case d.Allowed:
		s.st.ok.Add(1)
	default:
		s.st.no.Add(1)
	}
	return d, true
}

// ownedStats sums the counters of l's owner-routed limiters.
func (l *limits) ownedStats() (s gossip.OwnedStats) {
	for _, x := range l.all {
		if o, ok := x.(*gossip.OwnedLimiter); ok {
			s = s.Plus(o.Stats())
		}
	}
	return s
}
