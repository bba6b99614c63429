package capacity

import (
	"bytes"
	"encoding/json"
	"math"
	"path"
	"time"
)

// Template configures every resource whose id it matches.
type Template struct {
	// ID is an exact resource id, or a glob pattern (path.Match syntax:
	// "db.*", "api/?"). "*" is the catch-all every Config must have.
	ID string
	// Capacity is what the resource can take in total: a rate (units per
	// second) or a gauge (units in use at once). For Static it is the
	// capacity of each client instead.
	Capacity float64
	// Algorithm divides Capacity among the clients.
	Algorithm Algorithm
	// LeaseLength is how long a grant stays valid without a refresh.
	// Default 60s.
	LeaseLength time.Duration
	// RefreshInterval is how often clients should refresh: shorter than
	// LeaseLength. Default LeaseLength/4.
	RefreshInterval time.Duration
	// MaxLeaseLength bounds the leases any master may have granted on
	// these resources, also under an earlier configuration: at least
	// LeaseLength (the default), at most MaxLease. A new master learns for
	// at least this long, so that every lease a previous master gave out
	// has been reported or has expired when it starts sharing. To shorten
	// LeaseLength, keep MaxLeaseLength at the old length until every
	// server runs the new configuration and one old lease length has
	// passed; otherwise a new master may grant what an old lease holds.
	MaxLeaseLength time.Duration
	// LearningDuration is how long a server that has just become master
	// only confirms what clients say they hold, rebuilding its view of
	// the leases a previous master gave out. It must not be shorter than
	// MaxLeaseLength (the default).
	LearningDuration time.Duration
	// SafeCapacity is what a client in Safe mode (the default) may use
	// while it holds no lease: it comes on top of the leases, so with it
	// the clients enforce at most Capacity plus SafeCapacity for each
	// client without a lease. 0, the default, keeps the sum within
	// Capacity: a client without a lease admits nothing.
	SafeCapacity float64
}

// Config is the resource configuration of a server.
type Config struct {
	// Resources are matched against a resource id: an exact ID first,
	// then the patterns in order.
	Resources []Template
}

// Defaults filled in by ParseConfig and NewServer.
const (
	defaultLeaseLength = 60 * time.Second
)

type jsonTemplate struct {
	ID               string    `json:"id"`
	Capacity         float64   `json:"capacity"`
	Algorithm        Algorithm `json:"algorithm"`
	LeaseLength      string    `json:"lease_length,omitempty"`
	RefreshInterval  string    `json:"refresh_interval,omitempty"`
	MaxLeaseLength   string    `json:"max_lease_length,omitempty"`
	LearningDuration string    `json:"learning_duration,omitempty"`
	SafeCapacity     float64   `json:"safe_capacity,omitempty"`
}

// ParseConfig reads a Config from JSON such as
//
//	{"resources": [
//	  {"id": "db.writes", "capacity": 500, "algorithm": "fair_share",
//	   "lease_length": "60s", "refresh_interval": "15s",
//	   "max_lease_length": "5m"},
//	  {"id": "*", "capacity": 100, "algorithm": "proportional_share"}
//	]}
//
// refusing unknown fields, and validates it. Durations are Go durations.
// It returns the templates as written: their defaults are filled in by
// withDefaults, which NewServer and SetConfig apply. Errors wrap
// throttle.ErrInvalid.
func ParseConfig(data []byte) (Config, error) {
	var raw struct {
		Resources []jsonTemplate `json:"resources"`
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&raw); err != nil {
		return Config{}, invalidf("config: %v", err)
	}
	if dec.More() {
		return Config{}, invalidf("config: data after the JSON object")
	}
	var c Config
	for _, j := range raw.Resources {
		t := Template{ID: j.ID, Capacity: j.Capacity, Algorithm: j.Algorithm, SafeCapacity: j.SafeCapacity}
		for _, d := range []struct {
			s   string
			dst *time.Duration
		}{{j.LeaseLength, &t.LeaseLength}, {j.RefreshInterval, &t.RefreshInterval}, {j.MaxLeaseLength, &t.MaxLeaseLength}, {j.LearningDuration, &t.LearningDuration}} {
			if d.s == "" {
				continue
			}
			v, err := time.ParseDuration(d.s)
			if err != nil {
				return Config{}, invalidf("config: resource %q: %v", j.ID, err)
			}
			*d.dst = v
		}
		c.Resources = append(c.Resources, t)
	}
	return c, c.validate()
}

// validate checks c as NewServer would run it, with its defaults filled
// in. It does not modify c. Errors wrap throttle.ErrInvalid.
func (c Config) validate() error { return c.withDefaults().check() }

// withDefaults returns a copy of c whose templates have the default of
// every zero duration (see Template). It does not validate, and does not
// modify c's templates.
func (c Config) withDefaults() Config {
	out := Config{Resources: make([]Template, len(c.Resources))}
	for i, t := range c.Resources {
		if t.LeaseLength == 0 {
			t.LeaseLength = defaultLeaseLength
		}
		if t.RefreshInterval == 0 {
			t.RefreshInterval = t.LeaseLength / 4
		}
		if t.MaxLeaseLength == 0 {
			t.MaxLeaseLength = t.LeaseLength
		}
		if t.LearningDuration == 0 {
			t.LearningDuration = t.MaxLeaseLength
		}
		out.Resources[i] = t
	}
	return out
}

// check validates a Config with its defaults filled in.
func (c Config) check() error {
	seen := make(map[string]bool, len(c.Resources))
	for _, t := range c.Resources {
		if err := t.check(seen); err != nil {
			return err
		}
		seen[t.ID] = true
	}
	if !seen["*"] {
		return invalidf(`config: a catch-all template with id "*" is required`)
	}
	return nil
}

// check validates a template with its defaults filled in; seen holds the
// ids of the templates before it.
func (t Template) check(seen map[string]bool) error {
	switch {
	case t.ID == "" || len(t.ID) > maxIDLen:
		return invalidf("config: resource id must have 1 to %d bytes, got %q", maxIDLen, t.ID)
	case seen[t.ID]:
		return invalidf("config: resource %q configured twice", t.ID)
	case !(t.Capacity >= 0) || math.IsInf(t.Capacity, 0):
		return invalidf("config: resource %q: capacity must be finite and >= 0, got %v", t.ID, t.Capacity)
	case t.Algorithm < FairShare || t.Algorithm > None:
		return invalidf("config: resource %q: unknown algorithm %d", t.ID, int(t.Algorithm))
	case t.LeaseLength < time.Second || t.LeaseLength > MaxLease:
		return invalidf("config: resource %q: lease length must be in [1s, %v], got %v", t.ID, MaxLease, t.LeaseLength)
	case t.RefreshInterval <= 0 || t.RefreshInterval >= t.LeaseLength:
		return invalidf("config: resource %q: refresh interval must be in (0, lease length %v), got %v", t.ID, t.LeaseLength, t.RefreshInterval)
	case t.MaxLeaseLength < t.LeaseLength || t.MaxLeaseLength > MaxLease:
		return invalidf("config: resource %q: max lease length must be in [lease length %v, %v], got %v", t.ID, t.LeaseLength, MaxLease, t.MaxLeaseLength)
	case t.LearningDuration < t.MaxLeaseLength:
		return invalidf("config: resource %q: learning duration %v is shorter than the max lease length %v", t.ID, t.LearningDuration, t.MaxLeaseLength)
	case !(t.SafeCapacity >= 0) || t.SafeCapacity > t.Capacity:
		return invalidf("config: resource %q: safe capacity must be in [0, capacity], got %v", t.ID, t.SafeCapacity)
	}
	if _, err := path.Match(t.ID, ""); err != nil {
		return invalidf("config: resource %q: bad pattern: %v", t.ID, err)
	}
	return nil
}

// match returns the template of resource id: an exact id first, then the
// first matching pattern.
func (c Config) match(id string) (Template, bool) {
	for _, t := range c.Resources {
		if t.ID == id {
			return t, true
		}
	}
	for _, t := range c.Resources {
		// "*" is the catch-all: it matches ids with a "/" too, which
		// path.Match's "*" does not.
		if ok, _ := path.Match(t.ID, id); ok || t.ID == "*" {
			return t, true
		}
	}
	return Template{}, false
}
