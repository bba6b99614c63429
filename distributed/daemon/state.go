package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
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
// writing leaves the previous state or none, never half of one.
func (s *Server) saveState() error {
	if s.cfg.StateFile == "" {
		return nil
	}
	st := savedState{Saved: s.clk.Now(), Limits: map[string]map[string]int64{}}
	for name, x := range s.lim.Load().all {
		g, ok := x.(*gossip.Limiter)
		if !ok {
			continue
		}
		tags := map[string]int64{}
		g.Below(func(tag string, tokens int64) bool {
			if tag != gossip.OverflowKey {
				tags[tag] = tokens
			}
			return true
		})
		if len(tags) > 0 {
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
// and saved at most maxStateAge ago, into the limits of l whose name
// (rate and burst) is unchanged, each refilled for the time since it was
// saved (nothing if the clock reads earlier than the save), and removes the file so that a later crash does not restore it
// again. It returns how many tags it restored.
func (s *Server) restoreState(l *limits) (int, error) {
	if s.cfg.StateFile == "" {
		return 0, nil
	}
	b, err := os.ReadFile(s.cfg.StateFile)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	defer os.Remove(s.cfg.StateFile)
	var st savedState
	if err := json.Unmarshal(b, &st); err != nil {
		return 0, fmt.Errorf("state file %s: %w", s.cfg.StateFile, err)
	}
	// A clock stepped back since the save (age < 0) refills nothing:
	// ignoring the state would hand every tag a fresh burst.
	age := max(s.clk.Now()-st.Saved, 0)
	if age > int64(maxStateAge) {
		return 0, fmt.Errorf("state file %s saved %v ago, more than %v: ignored", s.cfg.StateFile, time.Duration(age), maxStateAge)
	}
	n := 0
	for name, tags := range st.Limits {
		x := l.all[name]
		g, ok := x.(*gossip.Limiter)
		if !ok {
			continue // the limit changed: its tags start full
		}
		burst := l.burst[x]
		r, _ := throttle.ParseRate(limitRate(x))
		regained := age / int64(r.Period()) * r.Count() // whole periods only: stricter
		for tag, tokens := range tags {
			if have := max(tokens, 0) + regained; have < burst {
				g.Allow(context.Background(), tag, int(burst-have)) // standalone: no peer is told
				n++
			}
		}
	}
	return n, nil
}
