package main

import (
	"bytes"
	_ "embed"
	"encoding/json"
	"net"
	"os"
	"slices"
	"time"

	"github.com/throttlekit/throttle/distributed/capacity"
	"github.com/throttlekit/throttle/distributed/capacity/etcdelection"
	"github.com/throttlekit/throttle/internal/conffile"
)

// fileConfig is the configuration file: server settings and the resource
// templates (capacity.ParseConfig's "resources").
type fileConfig struct {
	// Listen is the API address (gRPC, gRPC-Web and Connect JSON).
	Listen string `json:"listen"`
	// GRPCListen, when set, is a second API address that serves gRPC
	// only, with grpc-go's transport, at about a third of the CPU per call of
	// listen's; the same authentication, bounds (the http section's
	// timeouts and one max_connections for both ports) and metrics apply.
	GRPCListen string `json:"grpc_listen,omitempty"`
	// Admin is the address of /healthz, /metrics and /status; "" is off.
	Admin string `json:"admin,omitempty"`
	// Advertise is the API address the other replicas and the clients
	// know this server by; default the listen address, which must then
	// not be a wildcard when etcd is set.
	Advertise string `json:"advertise,omitempty"`
	// Etcd, when set, elects the master among the replicas that share
	// its prefix; without it this server is always the master.
	Etcd *etcdConfig `json:"etcd,omitempty"`
	// Parent, when set, makes this server a child in a server tree: the
	// API addresses of the parent level's replicas, from which it leases
	// the capacity it divides (capacity.WithParent).
	Parent []string `json:"parent,omitempty"`
	// DecreaseGrace is accepted for compatibility and has no effect: a
	// lowered lease counts at its old size until the client confirms the
	// lower one or the old lease expires (capacity.WithDecreaseGrace).
	DecreaseGrace string `json:"decrease_grace,omitempty"`
	// Auth secures the API port with TLS and client authentication;
	// without it anyone who reaches the port can act as any client.
	Auth *authConfig `json:"auth,omitempty"`
	// ParentAuth is how this server authenticates to its parent (with
	// Parent); without it the parent is called over plain HTTP.
	ParentAuth *parentAuthConfig `json:"parent_auth,omitempty"`
	// LeaseKeysFile, when set, is a JSON array of base64 keys (16 bytes
	// or more each) that all replicas share: the first signs each grant,
	// any verifies the grants clients report while a new master learns
	// (capacity.WithLeaseKeys). Without it a learning master takes the
	// clients' word for what they hold.
	LeaseKeysFile string `json:"lease_keys_file,omitempty"`
	// Limits bound the server's tables; absent fields keep the
	// package's defaults.
	Limits *limitsConfig `json:"limits,omitempty"`
	// HTTP bounds the connections of both ports; absent fields keep the
	// defaults.
	HTTP *httpConfig `json:"http,omitempty"`
	// Resources are the resource templates.
	Resources json.RawMessage `json:"resources"`
}

// limitsConfig bounds what clients can make a server hold
// (capacity.WithMaxResources, WithMaxClients, WithMaxLeases); 0 keeps the
// default.
type limitsConfig struct {
	// MaxResources bounds the resources tracked (capacity.DefaultMaxResources).
	MaxResources int `json:"max_resources,omitempty"`
	// MaxClientsPerResource bounds each resource's clients
	// (capacity.DefaultMaxClients).
	MaxClientsPerResource int `json:"max_clients_per_resource,omitempty"`
	// MaxLeases bounds the client leases in all (capacity.DefaultMaxLeases).
	MaxLeases int `json:"max_leases,omitempty"`
	// MaxLeasesPerClient bounds the leases of one client id
	// (capacity.DefaultMaxLeasesPerClient).
	MaxLeasesPerClient int `json:"max_leases_per_client,omitempty"`
}

// httpConfig bounds what a connection may take of the server: time to
// send its request, to read the answer, to stay idle, and the number of
// connections open at once. Durations are Go durations.
type httpConfig struct {
	// ReadHeaderTimeout bounds the time to send a request's headers
	// (default 5s).
	ReadHeaderTimeout string `json:"read_header_timeout,omitempty"`
	// ReadTimeout bounds the time to send a whole request, body included
	// (default 10s); a trickling body is cut off.
	ReadTimeout string `json:"read_timeout,omitempty"`
	// WriteTimeout bounds the time to read an answer (default 10s).
	WriteTimeout string `json:"write_timeout,omitempty"`
	// IdleTimeout closes a connection idle this long (default 2m).
	IdleTimeout string `json:"idle_timeout,omitempty"`
	// MaxHeaderBytes bounds a request's headers (default 16 KiB).
	MaxHeaderBytes int `json:"max_header_bytes,omitempty"`
	// MaxConnections bounds the API port's connections open at once;
	// more are closed as soon as accepted. Default: the open-file limit
	// less 128 (kept for the admin port, etcd, the parent and files).
	MaxConnections int `json:"max_connections,omitempty"`
	// AdminMaxConnections bounds the admin port's (default 32).
	AdminMaxConnections int `json:"admin_max_connections,omitempty"`
}

// httpLimits are validated httpConfig values.
type httpLimits struct {
	readHeader, read, write, idle time.Duration
	maxHeaderBytes                int
	maxConns, adminMaxConns       int
}

// Defaults of the http section.
const (
	defaultReadHeaderTimeout = 5 * time.Second
	defaultReadTimeout       = 10 * time.Second
	defaultWriteTimeout      = 10 * time.Second
	defaultIdleTimeout       = 2 * time.Minute
	defaultMaxHeaderBytes    = 16 << 10
	defaultAdminMaxConns     = 32
	reservedFiles            = 128
)

// limits validates h (nil: all defaults).
func (h *httpConfig) limits() (httpLimits, error) {
	l := httpLimits{readHeader: defaultReadHeaderTimeout, read: defaultReadTimeout, write: defaultWriteTimeout,
		idle: defaultIdleTimeout, maxHeaderBytes: defaultMaxHeaderBytes, adminMaxConns: defaultAdminMaxConns}
	l.maxConns = max(openFileLimit()-reservedFiles, 16)
	if h == nil {
		return l, nil
	}
	for _, d := range []struct {
		name, s string
		dst     *time.Duration
	}{{"read_header_timeout", h.ReadHeaderTimeout, &l.readHeader}, {"read_timeout", h.ReadTimeout, &l.read},
		{"write_timeout", h.WriteTimeout, &l.write}, {"idle_timeout", h.IdleTimeout, &l.idle}} {
		if d.s == "" {
			continue
		}
		v, err := time.ParseDuration(d.s)
		if err != nil || v <= 0 {
			return l, conffile.Invalid("http: %s: want a duration > 0, got %q", d.name, d.s)
		}
		*d.dst = v
	}
	for _, n := range []struct {
		name string
		v    int
		dst  *int
	}{{"max_header_bytes", h.MaxHeaderBytes, &l.maxHeaderBytes}, {"max_connections", h.MaxConnections, &l.maxConns},
		{"admin_max_connections", h.AdminMaxConnections, &l.adminMaxConns}} {
		switch {
		case n.v < 0:
			return l, conffile.Invalid("http: %s must be >= 0 (0 keeps the default), got %d", n.name, n.v)
		case n.v > 0:
			*n.dst = n.v
		}
	}
	return l, nil
}

// options returns the server options of l.
func (l *limitsConfig) options() []capacity.ServerOption {
	if l == nil {
		return nil
	}
	var opts []capacity.ServerOption
	if l.MaxResources > 0 {
		opts = append(opts, capacity.WithMaxResources(l.MaxResources))
	}
	if l.MaxClientsPerResource > 0 {
		opts = append(opts, capacity.WithMaxClients(l.MaxClientsPerResource))
	}
	if l.MaxLeases > 0 || l.MaxLeasesPerClient > 0 {
		total, per := l.MaxLeases, l.MaxLeasesPerClient
		if total == 0 {
			total = capacity.DefaultMaxLeases
		}
		if per == 0 {
			per = capacity.DefaultMaxLeasesPerClient
		}
		opts = append(opts, capacity.WithMaxLeases(total, per))
	}
	return opts
}

type etcdConfig struct {
	Endpoints []string `json:"endpoints"`
	// Prefix is the election's key prefix (default defaultPrefix).
	Prefix string `json:"prefix,omitempty"`
	// TTL is each replica's lease TTL, a whole number of seconds (default
	// etcdelection.DefaultTTL): how soon a dead master is replaced.
	TTL string `json:"ttl,omitempty"`
	// DialTimeout bounds connecting to etcd (default 5s).
	DialTimeout string `json:"dial_timeout,omitempty"`
}

const defaultPrefix = "/throttle/capacity/root"

// settings is a validated configuration.
type settings struct {
	file      fileConfig
	resources capacity.Config
	ttl       time.Duration
	dial      time.Duration
	grace     time.Duration
	http      httpLimits
	auth      apiAuth
	parent    capacity.Transport
	parentID  string
	leaseKeys [][]byte
}

//go:embed default.json
var defaultJSON []byte

// parseFile reads a configuration file's JSON strictly (unknown fields
// and duplicate keys are errors). Errors wrap throttle.ErrInvalid.
func parseFile(b []byte) (fileConfig, error) {
	var f fileConfig
	if err := conffile.Decode(b, &f); err != nil {
		return f, conffile.Invalid("%v", err)
	}
	return f, nil
}

// loadFile reads the file at path, or the embedded default for "".
func loadFile(path string) (fileConfig, []byte, error) {
	b := defaultJSON
	if path != "" {
		var err error
		if b, err = os.ReadFile(path); err != nil {
			return fileConfig{}, nil, err
		}
	}
	f, err := parseFile(b)
	return f, b, err
}

// validate checks f and returns its settings, with the defaults of what
// it leaves out. It does not modify f. Errors wrap throttle.ErrInvalid.
func (f fileConfig) validate() (*settings, error) {
	if err := f.checkAddrs(); err != nil {
		return nil, err
	}
	s := &settings{file: f, ttl: etcdelection.DefaultTTL, dial: 5 * time.Second, grace: time.Second}
	if err := s.readEtcd(); err != nil {
		return nil, err
	}
	if f.DecreaseGrace != "" {
		v, err := time.ParseDuration(f.DecreaseGrace)
		if err != nil || v < 0 {
			return nil, conffile.Invalid("decrease_grace: want a duration >= 0, got %q", f.DecreaseGrace)
		}
		s.grace = v
	}
	if err := s.readAccess(); err != nil {
		return nil, err
	}
	var err error
	if s.leaseKeys, err = loadLeaseKeys(f.LeaseKeysFile); err != nil {
		return nil, err
	}
	if l := f.Limits; l != nil && (l.MaxResources < 0 || l.MaxClientsPerResource < 0 || l.MaxLeases < 0 || l.MaxLeasesPerClient < 0) {
		return nil, conffile.Invalid("limits must be >= 0 (0 keeps the default)")
	}
	if len(bytes.TrimSpace(f.Resources)) == 0 {
		return nil, conffile.Invalid(`resources are required (at least the catch-all "*")`)
	}
	rc, err := capacity.ParseConfig(append(append([]byte(`{"resources":`), f.Resources...), '}'))
	if err != nil {
		return nil, err
	}
	s.resources = rc
	return s, nil
}

// loadLeaseKeys reads the lease keys file at path ("" is none): a JSON
// array of base64 keys of capacity.MinLeaseKeyLen bytes or more.
func loadLeaseKeys(path string) ([][]byte, error) {
	if path == "" {
		return nil, nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, conffile.Invalid("lease_keys_file: %v", err)
	}
	var keys [][]byte // encoding/json decodes base64 strings into []byte
	if err := json.Unmarshal(b, &keys); err != nil {
		return nil, conffile.Invalid("lease_keys_file: want a JSON array of base64 keys: %v", err)
	}
	if len(keys) == 0 {
		return nil, conffile.Invalid("lease_keys_file: no key")
	}
	for i, k := range keys {
		if len(k) < capacity.MinLeaseKeyLen {
			return nil, conffile.Invalid("lease_keys_file: key %d has %d bytes, at least %d are needed", i, len(k), capacity.MinLeaseKeyLen)
		}
	}
	return keys, nil
}

// checkAddrs checks the addresses f listens on, advertises and asks.
func (f fileConfig) checkAddrs() error {
	if err := conffile.CheckAddr("listen", f.Listen, true); err != nil {
		return err
	}
	if f.Admin != "" {
		if err := conffile.CheckAddr("admin", f.Admin, true); err != nil {
			return err
		}
	}
	if f.GRPCListen != "" {
		if err := conffile.CheckAddr("grpc_listen", f.GRPCListen, true); err != nil {
			return err
		}
	}
	if f.Advertise != "" {
		if err := conffile.CheckAddr("advertise", f.Advertise, false); err != nil {
			return err
		}
	}
	return conffile.CheckAddrs("parent", f.Parent)
}

// readEtcd checks the etcd section, if any, and reads its durations.
func (s *settings) readEtcd() error {
	e := s.file.Etcd
	if e == nil {
		return nil
	}
	if len(e.Endpoints) == 0 {
		return conffile.Invalid("etcd: endpoints are required (leave etcd out for a single server)")
	}
	if slices.Contains(e.Endpoints, "") {
		return conffile.Invalid("etcd: empty endpoint")
	}
	for _, d := range []struct {
		name, s string
		dst     *time.Duration
	}{{"ttl", e.TTL, &s.ttl}, {"dial_timeout", e.DialTimeout, &s.dial}} {
		if d.s == "" {
			continue
		}
		v, err := time.ParseDuration(d.s)
		if err != nil {
			return conffile.Invalid("etcd: %s: %v", d.name, err)
		}
		*d.dst = v
	}
	if s.ttl < time.Second || s.ttl%time.Second != 0 {
		return conffile.Invalid("etcd: ttl must be a whole number of seconds >= 1s, got %v", s.ttl)
	}
	if s.dial <= 0 {
		return conffile.Invalid("etcd: dial_timeout must be > 0, got %v", s.dial)
	}
	if _, port, _ := net.SplitHostPort(s.file.Listen); s.file.Advertise == "" && (conffile.Wildcard(s.file.Listen) || port == "0") {
		return conffile.Invalid("advertise is required when etcd is set and listen (%q) is a wildcard or port 0", s.file.Listen)
	}
	return nil
}

// readAccess reads the HTTP limits, the authentication of clients and
// the credentials for the parent.
func (s *settings) readAccess() error {
	f := s.file
	var err error
	if s.http, err = f.HTTP.limits(); err != nil {
		return err
	}
	if s.auth, err = f.Auth.load(); err != nil {
		return err
	}
	if f.ParentAuth != nil && len(f.Parent) == 0 {
		return conffile.Invalid("parent_auth needs parent")
	}
	s.parent, s.parentID, err = f.ParentAuth.transport()
	return err
}

// prefix is the election's key prefix.
func (s *settings) prefix() string {
	if s.file.Etcd != nil && s.file.Etcd.Prefix != "" {
		return s.file.Etcd.Prefix
	}
	return defaultPrefix
}

// restartNeeded names the first setting that differs between s and next
// and that only a restart can change ("" if none).
func (s *settings) restartNeeded(next *settings) string {
	a, b := s.file, next.file
	switch {
	case a.Listen != b.Listen:
		return "listen"
	case a.Admin != b.Admin:
		return "admin"
	case a.GRPCListen != b.GRPCListen:
		return "grpc_listen"
	case a.Advertise != b.Advertise:
		return "advertise"
	}
	ea, _ := json.Marshal(a.Etcd)
	eb, _ := json.Marshal(b.Etcd)
	if !bytes.Equal(ea, eb) {
		return "etcd"
	}
	if !slices.Equal(a.Parent, b.Parent) || a.DecreaseGrace != b.DecreaseGrace {
		return "parent"
	}
	if a.LeaseKeysFile != b.LeaseKeysFile || !slices.EqualFunc(s.leaseKeys, next.leaseKeys, bytes.Equal) {
		return "lease_keys_file"
	}
	la, _ := json.Marshal(a.Limits)
	lb, _ := json.Marshal(b.Limits)
	if !bytes.Equal(la, lb) {
		return "limits"
	}
	for _, p := range [][2]any{{a.HTTP, b.HTTP}, {a.Auth, b.Auth}, {a.ParentAuth, b.ParentAuth}} {
		x, _ := json.Marshal(p[0])
		y, _ := json.Marshal(p[1])
		if !bytes.Equal(x, y) {
			return "http, auth or parent_auth"
		}
	}
	return ""
}
