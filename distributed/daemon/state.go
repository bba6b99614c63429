package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/distributed/gossip"
)

// maxStateAge bounds the age of a state file (Config.StateFile) a daemon
// restores at its start: a daemon down for longer starts every tag on a
// full bucket.
const maxStateAge = time.Hour

// savedState is the content of a state file: when it was saved (the
// limiters' clock, in nanoseconds) and, per limit (by gossip name, which
// holds its rate and burst), the whole tokens of each tag below full.
type savedState struct {
	Saved  int64                       `json:"saved"`
	Limits map[string]map[string]int64 `json:"limits"`
}

// saveState writes the level of every tag below full to Config.StateFile,
// if set: to a temporary file renamed over it, so that a crash while
// writing leaves the previous state or none, never half of one. The
// limits a reload replaced and still carries usage from (see carry) are
// saved too, so that a tag not asked since keeps its usage.
func (s *Server) saveState() error {
	if s.cfg.StateFile == "" {
		return nil
	}
	st := savedState{Saved: s.clk.Now(), Limits: map[string]map[string]int64{}}
	for c := s.lim.Load(); c != nil; c = c.prev.Load() {
		for name, x := range c.all {
			g, ok := x.(*gossip.Limiter)
			if _, seen := st.Limits[name]; seen || !ok {
				continue
			}
			tags := map[string]int64{}
			g.Below(func(tag string, tokens int64) bool {
				if tag != gossip.OverflowKey {
					tags[tag] = tokens
				}
				return true
			})
			st.Limits[name] = tags
		}
	}
	b, err := json.Marshal(st)
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(s.cfg.StateFile), ".throttled-state-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // fails once renamed
	_, err = tmp.Write(b)
	if err = errors.Join(err, tmp.Sync(), tmp.Close()); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), s.cfg.StateFile)
}

// restoreState takes the tags' levels back from Config.StateFile, if set
// and saved at most maxStateAge ago, each refilled for the time since it
// was saved (less what a clock stepped back since takes away), into the
// limiters of l, and removes the file so that a later crash does not
// restore it again. A tag whose limit changed carries its usage as a
// reload does: its new bucket holds at most its burst less what the old
// one had used; the replaced limits are kept as a reload keeps them (see
// keepReplaced). It returns how many tags it restored.
func (s *Server) restoreState(l *limits) (int, error) {
	st, age, err := s.readState()
	if err != nil || st == nil {
		return 0, err
	}
	if err := s.keepReplaced(l, st, age); err != nil {
		return 0, err
	}
	have := map[string]int64{} // per tag, the tokens its saved levels leave it under l
	for name, tags := range st.Limits {
		burst, r, ok := parseLimitName(name)
		if !ok {
			continue
		}
		regained := regainedIn(age, r)
		for tag, tokens := range tags {
			lim := l.limiter([]byte(tag))
			level := min(max(tokens, 0)+regained, burst)
			if lim.Name() != name {
				level = l.burst[lim] - (burst - level) // the limit changed: carry the usage
			}
			if h, seen := have[tag]; !seen || level < h {
				have[tag] = level
			}
		}
	}
	n := 0
	for tag, h := range have {
		lim := l.limiter([]byte(tag))
		if g, ok := lim.(*gossip.Limiter); ok && h < l.burst[lim] {
			g.Allow(context.Background(), tag, int(l.burst[lim]-max(h, 0))) // standalone: no peer is told
			n++
		}
	}
	return n, nil
}

// keepReplaced restores the saved limits that l does not have (those a
// reload before the save had replaced and still carried usage from) into
// limiters of their own, made l's previous configuration for as long as a
// reload keeps one: a reload back to such a limit finds its buckets, as
// it would have without the restart, and a tag carries the usage of the
// one it had used most. Called before l serves.
func (s *Server) keepReplaced(l *limits, st *savedState, age int64) error {
	p := &limits{exact: maps.Clone(l.exact), globs: l.globs, def: l.def, all: map[string]bucketLimiter{},
		burst: maps.Clone(l.burst)}
	carried := map[string]int64{} // per tag, the lowest level carried from a replaced limit
	var refill time.Duration
	for name, tags := range st.Limits {
		burst, r, ok := parseLimitName(name)
		if _, have := l.all[name]; have || !ok {
			continue
		}
		x, err := s.newLimiter(s.cfg.Gossip, name, r, int(burst))
		if err != nil {
			for _, x := range p.all {
				x.Close()
			}
			return err
		}
		p.all[name], p.burst[x] = x, burst
		refill = max(refill, r.Duration(burst))
		regained := regainedIn(age, r)
		for tag, tokens := range tags {
			level := min(max(tokens, 0)+regained, burst)
			if g, ok := x.(*gossip.Limiter); ok && level < burst {
				g.Allow(context.Background(), tag, int(burst-level))
			}
			cur := l.limiter([]byte(tag))
			if c, seen := carried[tag]; !seen || l.burst[cur]-(burst-level) < c {
				carried[tag], p.exact[tag] = l.burst[cur]-(burst-level), x
			}
		}
	}
	if len(p.all) == 0 {
		return nil
	}
	l.prev.Store(p)
	time.AfterFunc(min(refill, maxCarry), func() {
		s.relMu.Lock()
		defer s.relMu.Unlock()
		s.dropPrev(l)
	})
	return nil
}

// readState reads Config.StateFile, if set and present, and removes it;
// it returns the state and its age, or an error if it cannot be read or
// is older than maxStateAge.
func (s *Server) readState() (*savedState, int64, error) {
	if s.cfg.StateFile == "" {
		return nil, 0, nil
	}
	b, err := os.ReadFile(s.cfg.StateFile)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, 0, nil
	}
	if err != nil {
		return nil, 0, err
	}
	defer os.Remove(s.cfg.StateFile)
	var st savedState
	if err := json.Unmarshal(b, &st); err != nil {
		return nil, 0, fmt.Errorf("state file %s: %w", s.cfg.StateFile, err)
	}
	// A clock stepped back since the save (age < 0) takes tokens away,
	// as it would have from the running daemon's buckets: ignoring the
	// state would hand every tag a fresh burst.
	age := s.clk.Now() - st.Saved
	if age > int64(maxStateAge) {
		return nil, 0, fmt.Errorf("state file %s saved %v ago, more than %v: ignored", s.cfg.StateFile, time.Duration(age), maxStateAge)
	}
	return &st, age, nil
}

// regainedIn returns the whole tokens rate r refills in age, rounded down
// (whole periods only); a negative age (a clock stepped back) takes
// tokens away, rounded up. Both stricter.
func regainedIn(age int64, r throttle.Rate) int64 {
	if age >= 0 {
		return age / int64(r.Period()) * r.Count()
	}
	tokens := math.Ceil(-float64(age) * float64(r.Count()) / float64(r.Period()))
	return -int64(min(tokens, 1<<40)) // past any burst: the bucket empties
}

// parseLimitName returns the burst and the rate of a limit's gossip name
// (see limitName).
func parseLimitName(name string) (burst int64, r throttle.Rate, ok bool) {
	i := strings.LastIndexByte(name, '|')
	if i < 0 {
		return 0, r, false
	}
	burst, err := strconv.ParseInt(name[i+1:], 10, 64)
	j := strings.LastIndexByte(name[:i], '|')
	if err != nil || j < 0 {
		return 0, r, false
	}
	r, err = throttle.ParseRate(name[j+1 : i])
	return burst, r, err == nil && r.Count() > 0 && r.Period() > 0
}
