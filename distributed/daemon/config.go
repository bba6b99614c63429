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
	"github.com/throttlekit/throttle/distributed/gossip"
	"github.com/throttlekit/throttle/internal/conffile"
	"github.com/throttlekit/throttle/internal/keyfile"
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
	// MaxConns bounds concurrent client connections; a connection beyond
	// it takes the place of the longest-idle one (see IdleBudget), or is
	// sent "RF\n" and closed. Default: the open-file limit (RLIMIT_NOFILE,
	// whose soft limit is raised to the hard one where allowed) less 64
	// descriptors kept for listeners, gossip and logs, at most 65536.
	MaxConns int `json:"max_conns,omitempty"`
	// MaxConnsPerAddr bounds the connections of one client: one IP
	// address over TCP, one process (user and process id of the peer,
	// SO_PEERCRED on Linux) over a Unix socket, so that one host or one
	// local process cannot take them all. A connection beyond it takes
	// the place of the client's longest-idle one (see IdleBudget), or is
	// sent "RF\n" and closed. Default: MaxConns less a sixteenth of it, kept
	// for other clients, and on Linux at most what keeps the kernel
	// memory one client can pin (unread replies and socket buffers, about
	// 300 KB per connection) under half the host's TCP memory-pressure
	// threshold (net.ipv4.tcp_mem). Local workers all connect from the
	// same loopback address over TCP, so they share a cap (idle
	// connections make room for active workers, and on Linux a process
	// holding fewer connections takes the place of one of the biggest
	// holder's: see Server); on the Unix socket, recommended for local
	// workers, each process has its own.
	MaxConnsPerAddr int `json:"max_conns_per_addr,omitempty"`
	// IdleTimeout closes a connection that sends nothing for this long
	// (default 5m).
	IdleTimeout Duration `json:"idle_timeout,omitempty"`
	// IdleBudget lets a new connection take the place of an idle one at
	// a cap: when it would exceed MaxConnsPerAddr, the client's
	// connection that has received nothing for the longest time is
	// closed instead, if that is IdleBudget or longer (at MaxConns, the
	// longest-idle connection of any client). Only when none has been
	// idle so long is the new connection refused ("RF\n"). A connection
	// that sent a byte within IdleBudget is never closed for another. So
	// a process holding idle connections cannot lock out the others that
	// share its cap (local workers on TCP loopback share one address).
	// Default 10s, or IdleTimeout if shorter; at IdleTimeout or above,
	// no connection is reclaimed before it times out.
	IdleBudget Duration `json:"idle_budget,omitempty"`
	// WriteTimeout closes a connection whose replies cannot be written
	// for this long: a client that pipelines queries and never reads its
	// replies. Default 10s, or IdleTimeout if shorter.
	WriteTimeout Duration `json:"write_timeout,omitempty"`
	// MaxKeys bounds the tags tracked at once per limit (buckets and
	// gossip counters): about 140 bytes of heap each, plus 144 for each
	// peer that reported the tag (490 with two peers; the process holds
	// about twice its heap with Go's default GC). At the cap new tags are
	// still limited, by a bucket shared by all overflowing tags of that
	// limit (and gossiped as one key), never admitted unlimited. Default
	// 1,000,000.
	MaxKeys int `json:"max_keys,omitempty"`
	// Admin is an optional TCP address ("127.0.0.1:9390") of an HTTP
	// listener serving /healthz (no token spent) and /metrics (Prometheus
	// text format). Empty: none.
	Admin string `json:"admin,omitempty"`
	// StateFile, for a daemon without gossip, is where Shutdown (SIGTERM
	// for throttled) saves the level of every tag below full, and where
	// the next start takes them back from (then removes it), refilled for
	// the time the daemon was down, if that was at most an hour: so a
	// restart does not give every tag a fresh burst. Empty: none (a
	// restart starts every tag full). A crash saves nothing. With gossip,
	// the peers catch a restarted daemon up instead.
	StateFile string `json:"state_file,omitempty"`
	// Gossip configures the peer-to-peer exchange. With no peers the
	// daemon limits on its own.
	Gossip Gossip `json:"gossip"`
	// Envoy is the section of the Envoy rate-limit service that
	// cmd/throttled runs beside the daemon (the module extra/envoyrls
	// reads it: see its ServerConfig). The daemon itself only keeps it.
	Envoy json.RawMessage `json:"envoy,omitempty"`

	hooks *hooks // tests only: sockets in memory
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
	// Peers are the other daemons' gossip addresses. A reload joins new
	// ones and leaves those no longer listed.
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
	// KeyFile is a key file: one AES key (16, 24 or 32 bytes) a line in
	// standard base64, the primary first; blank lines and lines starting
	// with # are skipped. With it every gossip
	// datagram is encrypted and authenticated with AES-GCM under its
	// first key and accepted under any of them (gossip.Seal), so tags do
	// not travel in clear, and the secret is optional. Reload reads it
	// again: keys rotate without a restart (add the new key on every
	// daemon, then move it first on every daemon, then remove the old).
	KeyFile string `json:"key_file,omitempty"`
	// Routing selects how the daemons share the limits: "all" (the
	// default) decides each query on the daemon that receives it and
	// gossips every daemon's counters to every other (gossip.Limiter);
	// "owner" decides each tag on one daemon, its owner by rendezvous
	// hashing over the live daemons, to which the others forward their
	// queries in batches (gossip.OwnedLimiter): exact, and memory and
	// traffic per tag that do not grow with the number of daemons, for a
	// round trip on most queries. See "Which to pick when" in
	// docs/design/gossip.md.
	Routing string `json:"routing,omitempty"`
	// ForwardTimeout is how long a query forwarded to its tag's owner
	// waits for the answer before it is decided on this daemon's
	// fallback bucket of the tag (the limit divided by the number of
	// daemons): routing "owner" only. Default
	// gossip.DefaultForwardTimeout.
	ForwardTimeout Duration `json:"forward_timeout,omitempty"`
	// ForwardDelay is the least time between two datagrams of queries
	// this daemon forwards to one owner (but for full ones): under load
	// queries gather for up to that long, so that the datagrams, and the
	// owner's answers, do not grow with the queries. Routing "owner"
	// only. Default gossip.DefaultForwardDelay.
	ForwardDelay Duration `json:"forward_delay,omitempty"`
	// Members replaces Peers by a membership with failure detection,
	// which Membership starts.
	Members *Members `json:"members,omitempty"`
	// Membership starts the membership of Members: set by the program
	// (cmd/throttled runs memberlist), not by the file.
	Membership MembershipFunc `json:"-"`
}

// Values of Gossip.Routing.
const (
	routingAll   = "all"   // every daemon decides, counters gossiped to all
	routingOwner = "owner" // each tag decided by its owner daemon
)

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
// every tag. Like ParseConfig, it returns the settings as written, with
// defaults not yet filled in.
func DefaultConfig() Config {
	c, err := ParseConfig(defaultJSON)
	if err != nil {
		panic("daemon: embedded default.json: " + err.Error())
	}
	return c
}

// ParseConfig reads a JSON configuration strictly (unknown fields and
// duplicate keys are errors) and validates it. It returns the settings
// as written: defaults and derived settings (such as WriteTimeout from
// IdleTimeout) are filled in by WithDefaults, which New and Reload apply,
// so they follow what a caller changes in between. Errors wrap
// throttle.ErrInvalid.
func ParseConfig(b []byte) (Config, error) {
	var c Config
	if err := conffile.Decode(b, &c); err != nil {
		return c, conffile.Invalid("%v", err)
	}
	return c, c.Validate()
}

// minTimeout is the shortest IdleTimeout and WriteTimeout: below it a
// connection could not be served at all.
const minTimeout = 10 * time.Millisecond

// Validate checks c as New would run it, with its defaults filled in. It
// does not modify c. Errors wrap throttle.ErrInvalid.
func (c Config) Validate() error { return c.WithDefaults().check() }

// WithDefaults returns c with the default of every zero setting that has
// one, derived settings (WriteTimeout from IdleTimeout) included. It does
// not validate: values out of range are kept, for Validate to refuse.
func (c Config) WithDefaults() Config {
	if c.MaxTagLen == 0 {
		c.MaxTagLen = 256
	}
	if c.MaxConns == 0 {
		c.MaxConns = defaultMaxConns(fileLimit())
	}
	if c.MaxConnsPerAddr == 0 && c.MaxConns > 0 {
		c.MaxConnsPerAddr = defaultPerAddr(c.MaxConns, tcpMemPressure(), connMemory())
	}
	if c.IdleTimeout == 0 {
		c.IdleTimeout = Duration(5 * time.Minute)
	}
	if c.IdleBudget == 0 {
		c.IdleBudget = min(Duration(10*time.Second), c.IdleTimeout)
	}
	if c.WriteTimeout == 0 {
		c.WriteTimeout = min(Duration(10*time.Second), c.IdleTimeout)
	}
	if c.MaxKeys == 0 {
		c.MaxKeys = 1_000_000
	}
	if c.Gossip.Routing == "" {
		c.Gossip.Routing = routingAll
	}
	return c
}

// check validates a Config with its defaults filled in.
func (c Config) check() error {
	if err := c.checkSockets(); err != nil {
		return err
	}
	if err := c.checkBounds(); err != nil {
		return err
	}
	if err := c.checkLimits(); err != nil {
		return err
	}
	return c.Gossip.check()
}

// checkSockets checks the listeners, the admin address and the state
// file.
func (c *Config) checkSockets() error {
	if len(c.Listen) == 0 {
		return conffile.Invalid("listen: no socket to listen on")
	}
	seen := map[string]bool{}
	for _, l := range c.Listen {
		network, addr, err := splitListen(l)
		if err == nil && network == "tcp" {
			err = conffile.CheckHostPort(addr, true)
		}
		if err != nil {
			return conffile.Invalid("listen %q: %v", l, err)
		}
		if seen[network+":"+addr] {
			return conffile.Invalid("listen %q: listed twice", l)
		}
		seen[network+":"+addr] = true
	}
	if c.StateFile != "" && c.Gossip.Listen != "" {
		return conffile.Invalid("state_file is for a daemon without gossip: its peers catch a restarted daemon up")
	}
	if c.Admin == "" {
		return nil
	}
	return conffile.CheckAddr("admin", c.Admin, true)
}

// checkBounds checks the bounds on tags, connections, timeouts and keys.
func (c *Config) checkBounds() error {
	switch {
	case c.MaxTagLen < 1 || c.MaxTagLen > 1024:
		return conffile.Invalid("max_tag_len %d: must be in [1, 1024]", c.MaxTagLen)
	case c.MaxConns < 1:
		return conffile.Invalid("max_conns %d: must be positive", c.MaxConns)
	case c.MaxConnsPerAddr < 1:
		return conffile.Invalid("max_conns_per_addr %d: must be positive", c.MaxConnsPerAddr)
	case c.IdleTimeout < Duration(minTimeout):
		return conffile.Invalid("idle_timeout %v: must be at least %v", time.Duration(c.IdleTimeout), minTimeout)
	case c.IdleBudget < Duration(minTimeout):
		return conffile.Invalid("idle_budget %v: must be at least %v", time.Duration(c.IdleBudget), minTimeout)
	case c.WriteTimeout < Duration(minTimeout):
		return conffile.Invalid("write_timeout %v: must be at least %v", time.Duration(c.WriteTimeout), minTimeout)
	case c.MaxKeys < 1:
		return conffile.Invalid("max_keys %d: must be positive", c.MaxKeys)
	}
	return nil
}

// checkLimits checks the default limit and the rules.
func (c *Config) checkLimits() error {
	if err := c.Default.check(); err != nil {
		return conffile.Invalid("default: %v", err)
	}
	patterns := map[string]bool{}
	for i, r := range c.Rules {
		if r.Pattern == "" || len(r.Pattern) > 200 {
			return conffile.Invalid("rules[%d]: pattern must have 1 to 200 bytes", i)
		}
		if patterns[r.Pattern] {
			return conffile.Invalid("rules[%d]: pattern %q listed twice (the first would always win)", i, r.Pattern)
		}
		patterns[r.Pattern] = true
		if err := r.Limit.check(); err != nil {
			return conffile.Invalid("rules[%d] (%q): %v", i, r.Pattern, err)
		}
	}
	return nil
}

// check checks the gossip addresses and interval.
func (g *Gossip) check() error {
	if g.Listen == "" && len(g.Peers) > 0 {
		return conffile.Invalid("gossip: peers need gossip.listen")
	}
	if g.Listen != "" {
		if err := conffile.CheckAddr("gossip.listen", g.Listen, true); err != nil {
			return err
		}
		if g.Advertise == "" && conffile.Wildcard(g.Listen) {
			return conffile.Invalid("gossip.listen %q is a wildcard: set gossip.advertise to the address the peers list for this daemon", g.Listen)
		}
	}
	if g.Advertise != "" {
		if err := conffile.CheckAddr("gossip.advertise", g.Advertise, false); err != nil {
			return err
		}
	}
	if err := conffile.CheckAddrs("gossip.peers", g.Peers); err != nil {
		return err
	}
	if g.Interval < 0 || (g.Interval > 0 && time.Duration(g.Interval) < time.Millisecond) {
		return conffile.Invalid("gossip.interval %v: must be at least 1ms", time.Duration(g.Interval))
	}
	if g.Routing != routingAll && g.Routing != routingOwner {
		return conffile.Invalid("gossip.routing %q: must be %q or %q", g.Routing, routingAll, routingOwner)
	}
	if g.ForwardTimeout < 0 || g.ForwardDelay < 0 {
		return conffile.Invalid("gossip.forward_timeout %v, forward_delay %v: must not be negative",
			time.Duration(g.ForwardTimeout), time.Duration(g.ForwardDelay))
	}
	return g.Members.check(g)
}

// check validates the membership settings, if any.
func (m *Members) check(g *Gossip) error {
	if m == nil {
		return nil
	}
	switch {
	case g.Listen == "":
		return conffile.Invalid("gossip.members needs gossip.listen")
	case len(g.Peers) > 0:
		return conffile.Invalid("gossip.members and gossip.peers: list the seeds in gossip.members.seeds")
	case m.Rejoin < 0:
		return conffile.Invalid("gossip.members.rejoin %v is negative", time.Duration(m.Rejoin))
	}
	if err := conffile.CheckAddr("gossip.members.bind", m.Bind, true); err != nil {
		return err
	}
	for _, a := range append([]string{m.Advertise}, m.Seeds...) {
		if err := conffile.CheckHostPort(a, false); a != "" && err != nil {
			return conffile.Invalid("gossip.members address %q: %v", a, err)
		}
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

// defaultMaxConns derives max_conns from the open-file limit.
func defaultMaxConns(nofile uint64) int {
	const reserve = 64
	switch {
	case nofile == 0:
		return 4096 // unknown
	case nofile <= 2*reserve:
		return max(int(nofile/2), 1)
	default:
		return int(min(nofile-reserve, 65536))
	}
}

// defaultPerAddr derives max_conns_per_addr: maxConns less a sixteenth,
// and at most half the TCP memory-pressure threshold (0: unknown) at
// perConn bytes per connection.
func defaultPerAddr(maxConns int, pressure, perConn uint64) int {
	n := maxConns - maxConns/16
	if pressure > 0 {
		n = min(n, int(min(pressure/2/perConn, 1<<30)))
	}
	return max(n, 1)
}

// CheckSecret checks that gossip, if enabled, has a secret long enough
// (from gossip.secret, gossip.secret_file or THROTTLED_SECRET), without
// binding anything. Errors wrap throttle.ErrInvalid.
func (c Config) CheckSecret() error {
	if c.Gossip.Listen == "" {
		return nil
	}
	secret, err := c.Gossip.secret()
	if err != nil {
		return fmt.Errorf("%w: gossip secret: %v", throttle.ErrInvalid, err)
	}
	if c.Gossip.KeyFile != "" {
		if _, err := keyfile.Load(c.Gossip.KeyFile); err != nil || len(secret) == 0 {
			return err
		}
	}
	if len(secret) < gossip.MinSecretLen {
		return fmt.Errorf("%w: gossip needs a secret of %d bytes or more (gossip.secret, gossip.secret_file or THROTTLED_SECRET)",
			throttle.ErrInvalid, gossip.MinSecretLen)
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
	if network == "unix" && strings.ContainsRune(addr, 0) {
		return "", "", errors.New("NUL in socket path")
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
