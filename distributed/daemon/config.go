package daemon

import (
	"bytes"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/throttlekit/throttle"
)

// Config is the daemon's configuration, read from JSON (see
// default.json, which DefaultConfig returns).
type Config struct {
	// Listen lists the sockets to answer queries on: "tcp:HOST:PORT" or
	// "unix:/path/to.sock". A bare "HOST:PORT" means TCP.
	Listen []string `json:"listen"`
	// Default is the limit for tags that match no rule.
	Default Limit `json:"default"`
	// Rules map tag patterns to limits; the first match wins. In a
	// pattern, * matches any run of bytes and ? any one byte; anything
	// else matches itself.
	Rules []Rule `json:"rules,omitempty"`
	// MaxTagLen bounds a tag in bytes (default 256, at most 1024). A
	// longer line gets "ER\n" and the connection is closed.
	MaxTagLen int `json:"max_tag_len,omitempty"`
	// MaxConns bounds concurrent client connections (default 65536);
	// connections beyond it are closed at once.
	MaxConns int `json:"max_conns,omitempty"`
	// IdleTimeout closes a connection that sends nothing for this long
	// (default 5m).
	IdleTimeout Duration `json:"idle_timeout,omitempty"`
	// Gossip configures the peer-to-peer exchange. With no peers the
	// daemon limits on its own.
	Gossip Gossip `json:"gossip"`
}

// Limit is a token bucket: Rate as "count/period" (see
// throttle.ParseRate: "100/s", "5/1m") and Burst tokens.
type Limit struct {
	Rate  string `json:"rate"`
	Burst int    `json:"burst"`
}

// Rule applies Limit to the tags that match Pattern.
type Rule struct {
	Pattern string `json:"pattern"`
	Limit
}

// Gossip configures the gossip node (see package gossip).
type Gossip struct {
	// Listen is the UDP address to gossip on, e.g. "0.0.0.0:7946". Empty
	// disables gossip (then Peers must be empty).
	Listen string `json:"listen,omitempty"`
	// Advertise is the address the peers know this daemon by (the entry
	// in their peers lists). Default: Listen, which is right unless
	// Listen is a wildcard such as "0.0.0.0:7946".
	Advertise string `json:"advertise,omitempty"`
	// Peers are the other daemons' gossip addresses.
	Peers []string `json:"peers,omitempty"`
	// Interval is the gossip period (default 1s).
	Interval Duration `json:"interval,omitempty"`
	// Secret is the shared HMAC key (16 bytes or more). SecretFile, or
	// the environment variable THROTTLED_SECRET, can supply it instead.
	Secret     string `json:"secret,omitempty"`
	SecretFile string `json:"secret_file,omitempty"`
	// SpendCap enables gossip's per-node spend cap.
	SpendCap bool `json:"spend_cap,omitempty"`
	// Copies is how many times each gossip datagram is sent (default
	// gossip.DefaultCopies): more survives more packet loss, at a traffic
	// cost in proportion.
	Copies int `json:"copies,omitempty"`
}

// Duration is a time.Duration written in JSON as a Go duration string
// ("1s", "250ms").
type Duration time.Duration

// UnmarshalJSON reads a duration string.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("duration must be a string like \"1s\": %w", err)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return err
	}
	*d = Duration(v)
	return nil
}

// MarshalJSON writes a duration string.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

//go:embed default.json
var defaultJSON []byte

// DefaultConfig returns the embedded configuration: one node, no peers,
// TCP on 127.0.0.1:7390, 10 requests per second with a burst of 20 for
// every tag.
func DefaultConfig() Config {
	c, err := ParseConfig(defaultJSON)
	if err != nil {
		panic("daemon: embedded default.json: " + err.Error())
	}
	return c
}

// DefaultJSON returns the embedded default configuration file.
func DefaultJSON() []byte { return bytes.Clone(defaultJSON) }

// ParseConfig reads a JSON configuration strictly (unknown fields are
// errors) and validates it. Errors wrap throttle.ErrInvalid.
func ParseConfig(b []byte) (Config, error) {
	var c Config
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		return c, fmt.Errorf("%w: config: %v", throttle.ErrInvalid, err)
	}
	if dec.More() {
		return c, fmt.Errorf("%w: config: trailing data", throttle.ErrInvalid)
	}
	return c, c.Validate()
}

// LoadConfig reads and validates a JSON configuration file.
func LoadConfig(path string) (Config, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Config{}, err
	}
	return ParseConfig(b)
}

// Validate checks c and fills in defaults. Errors wrap
// throttle.ErrInvalid.
func (c *Config) Validate() error {
	bad := func(f string, a ...any) error {
		return fmt.Errorf("%w: config: %s", throttle.ErrInvalid, fmt.Sprintf(f, a...))
	}
	if len(c.Listen) == 0 {
		return bad("listen: no socket to listen on")
	}
	for _, l := range c.Listen {
		if _, _, err := splitListen(l); err != nil {
			return bad("listen %q: %v", l, err)
		}
	}
	if c.MaxTagLen == 0 {
		c.MaxTagLen = 256
	}
	if c.MaxTagLen < 1 || c.MaxTagLen > 1024 {
		return bad("max_tag_len %d: must be in [1, 1024]", c.MaxTagLen)
	}
	if c.MaxConns == 0 {
		c.MaxConns = 65536
	}
	if c.MaxConns < 1 {
		return bad("max_conns %d: must be positive", c.MaxConns)
	}
	if c.IdleTimeout == 0 {
		c.IdleTimeout = Duration(5 * time.Minute)
	}
	if c.IdleTimeout < 0 {
		return bad("idle_timeout must be positive")
	}
	if err := c.Default.check(); err != nil {
		return bad("default: %v", err)
	}
	for i, r := range c.Rules {
		if r.Pattern == "" || len(r.Pattern) > 200 {
			return bad("rules[%d]: pattern must have 1 to 200 bytes", i)
		}
		if err := r.Limit.check(); err != nil {
			return bad("rules[%d] (%q): %v", i, r.Pattern, err)
		}
	}
	g := &c.Gossip
	if g.Listen == "" && len(g.Peers) > 0 {
		return bad("gossip: peers need gossip.listen")
	}
	if g.Interval < 0 || (g.Interval > 0 && time.Duration(g.Interval) < time.Millisecond) {
		return bad("gossip.interval %v: must be at least 1ms", time.Duration(g.Interval))
	}
	return nil
}

func (l Limit) check() error {
	r, err := throttle.ParseRate(l.Rate)
	if err != nil {
		return err
	}
	if err := r.Validate(); err != nil {
		return err
	}
	if l.Burst < 1 {
		return errors.New("burst must be positive")
	}
	return nil
}

// secret resolves the gossip secret: Secret, else SecretFile, else the
// THROTTLED_SECRET environment variable.
func (g Gossip) secret() ([]byte, error) {
	switch {
	case g.Secret != "":
		return []byte(g.Secret), nil
	case g.SecretFile != "":
		b, err := os.ReadFile(g.SecretFile)
		if err != nil {
			return nil, err
		}
		return bytes.TrimSpace(b), nil
	default:
		return []byte(os.Getenv("THROTTLED_SECRET")), nil
	}
}

// splitListen parses "tcp:ADDR", "unix:PATH" or a bare TCP "HOST:PORT".
func splitListen(s string) (network, addr string, err error) {
	switch {
	case strings.HasPrefix(s, "tcp:"):
		network, addr = "tcp", s[4:]
	case strings.HasPrefix(s, "unix:"):
		network, addr = "unix", s[5:]
	default:
		network, addr = "tcp", s
	}
	if addr == "" {
		return "", "", errors.New("empty address")
	}
	return network, addr, nil
}

// match reports whether tag matches pattern: * matches any run of bytes
// (including none), ? exactly one byte, any other byte itself.
func match(pattern string, tag []byte) bool {
	p, t := 0, 0
	star, mark := -1, 0
	for t < len(tag) {
		switch {
		case p < len(pattern) && (pattern[p] == '?' || pattern[p] == tag[t]):
			p++
			t++
		case p < len(pattern) && pattern[p] == '*':
			star, mark = p, t
			p++
		case star >= 0:
			p = star + 1
			mark++
			t = mark
		default:
			return false
		}
	}
	for p < len(pattern) && pattern[p] == '*' {
		p++
	}
	return p == len(pattern)
}
