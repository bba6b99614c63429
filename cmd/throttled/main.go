// Command throttled is a rate-limiting daemon: one instance per host
// answers "serve or throttle this tag?" for many local workers over a
// line protocol on TCP or a Unix socket, and gossips with its peers on
// other hosts so that a client spread over N hosts by a load balancer gets
// its configured rate in all, not N times it. See package
// github.com/throttlekit/throttle/distributed/daemon for the protocol.
//
// With no flags it runs one node on 127.0.0.1:7390 with the embedded
// default limits (10/s, burst 20, for every tag):
//
//	go run ./cmd/throttled
//	printf 'alice\nalice\n' | nc -q1 127.0.0.1 7390
//
// Flags override the configuration file (-config, JSON; -print-config
// shows the effective configuration, which -config reads back). -check
// validates the configuration and runs a self-test on a private loopback
// socket, gossip off: it binds none of the configured addresses and sends
// nothing to the peers. It stops cleanly (exit 0) on SIGINT or SIGTERM,
// after answering every query it had received (within 5 s), and reloads
// the configuration file on SIGHUP: limits and connection settings change
// at once, and a changed limit keeps its tags' usage; an invalid file, or
// one that changes what needs a restart (listeners, gossip but for its
// peers, admin), is refused with a log line and the running configuration
// stays.
//
// Peers are a static list (-peers, gossip.peers), or found and watched by
// memberlist (-members, gossip.members: seeds, DNS names, SWIM failure
// detection); with a key file (-key-file, gossip.key_file) the counters
// and memberlist's traffic are encrypted under its keys, which SIGHUP
// reads again, so keys rotate without a restart.
//
// With an "envoy" section (or -envoy-grpc and -envoy-config) it also
// serves Envoy's global rate-limit API, envoy.service.ratelimit.v3, from
// envoyproxy/ratelimit's YAML configuration (see package
// github.com/throttlekit/throttle/extra/envoyrls and docs/guide/envoy.md);
// SIGHUP rereads those YAML files too, and a change of the section itself
// needs a restart.
package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/throttlekit/throttle/distributed/daemon"
	"github.com/throttlekit/throttle/distributed/daemon/client"
	"github.com/throttlekit/throttle/failsafe"
	"github.com/throttlekit/throttle/internal/cmdkit"
	"github.com/throttlekit/throttle/internal/keyfile"
)

func main() { cmdkit.Main("throttled", run) }

type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, ",") }
func (l *listFlag) Set(s string) error { *l = append(*l, strings.Split(s, ",")...); return nil }

// options are the command line.
type options struct {
	cmdkit.Flags
	rate, gossipAddr, advertise, secretFile, query, admin string
	keyFile, membersBind, envoyGRPC, envoyConfig          string
	burst                                                 int
	interval                                              time.Duration
	check, spendCap                                       bool
	listen, peers, seeds                                  listFlag
}

func parseFlags(args []string, stderr io.Writer) (*options, error) {
	o := &options{}
	fs := o.FlagSet("throttled", stderr)
	fs.BoolVar(&o.check, "check", false, "validate the configuration, self-test on a private loopback port with gossip off, and exit")
	fs.StringVar(&o.rate, "rate", "", "default rate for every tag, e.g. 100/s (overrides the config)")
	fs.IntVar(&o.burst, "burst", 0, "default burst (overrides the config)")
	fs.StringVar(&o.gossipAddr, "gossip", "", "UDP address to gossip on, e.g. 0.0.0.0:7946 (overrides the config)")
	fs.StringVar(&o.advertise, "advertise", "", "gossip address the peers know this daemon by, required when -gossip binds a wildcard (overrides the config)")
	fs.DurationVar(&o.interval, "interval", 0, "gossip interval (overrides the config)")
	fs.StringVar(&o.secretFile, "secret-file", "", "file holding the gossip secret (or set THROTTLED_SECRET)")
	fs.BoolVar(&o.spendCap, "spend-cap", false, "enable the per-node spend cap")
	fs.StringVar(&o.admin, "admin", "", "HTTP address for /healthz and /metrics, e.g. 127.0.0.1:9390 (overrides the config)")
	fs.StringVar(&o.query, "query", "", "client mode: ask the daemon at the first listen address about these comma-separated tags, print the replies, and exit")
	fs.Var(&o.listen, "listen", "socket to serve on, tcp:HOST:PORT or unix:PATH (repeatable; overrides the config)")
	fs.Var(&o.peers, "peers", "gossip peers, comma separated HOST:PORT (overrides the config)")
	fs.StringVar(&o.keyFile, "key-file", "", "gossip key file: one base64 AES key a line, the primary first (overrides the config)")
	fs.StringVar(&o.membersBind, "members", "", "memberlist address to find the peers by, e.g. 0.0.0.0:7947, instead of -peers (overrides the config)")
	fs.StringVar(&o.envoyGRPC, "envoy-grpc", "", "serve Envoy's rate-limit API (RLS v3) on this gRPC address, e.g. 0.0.0.0:8081 (overrides envoy.grpc)")
	fs.StringVar(&o.envoyConfig, "envoy-config", "", "envoyproxy/ratelimit YAML configuration for the RLS API: a file or a directory (overrides envoy.config)")
	fs.Var(&o.seeds, "seeds", "memberlist addresses or DNS names to join through, comma separated HOST:PORT (overrides the config)")
	if err := cmdkit.Parse(fs, args); err != nil {
		return nil, err
	}
	return o, nil
}

// config reads the configuration file (or the embedded default), applies
// the flags over it and validates the result.
func (o *options) config() (daemon.Config, error) {
	cfg := daemon.DefaultConfig()
	if o.ConfigPath != "" {
		b, err := os.ReadFile(o.ConfigPath)
		if err == nil {
			cfg, err = daemon.ParseConfig(b)
		}
		if err != nil {
			return cfg, err
		}
	}
	if len(o.listen) > 0 {
		cfg.Listen = o.listen
	}
	if o.rate != "" {
		cfg.Default.Rate = o.rate
	}
	if o.burst != 0 {
		cfg.Default.Burst = o.burst
	}
	if o.gossipAddr != "" {
		cfg.Gossip.Listen = o.gossipAddr
	}
	if o.advertise != "" {
		cfg.Gossip.Advertise = o.advertise
	}
	if len(o.peers) > 0 {
		cfg.Gossip.Peers = o.peers
	}
	if o.interval != 0 {
		cfg.Gossip.Interval = daemon.Duration(o.interval)
	}
	if o.secretFile != "" {
		cfg.Gossip.SecretFile = o.secretFile
	}
	if o.spendCap {
		cfg.Gossip.SpendCap = true
	}
	if o.keyFile != "" {
		cfg.Gossip.KeyFile = o.keyFile
	}
	if o.membersBind != "" || len(o.seeds) > 0 {
		m := daemon.Members{}
		if cfg.Gossip.Members != nil {
			m = *cfg.Gossip.Members
		}
		m.Bind = cmp.Or(o.membersBind, m.Bind)
		if len(o.seeds) > 0 {
			m.Seeds = o.seeds
		}
		cfg.Gossip.Members = &m
	}
	if o.admin != "" {
		cfg.Admin = o.admin
	}
	cfg = cfg.WithDefaults()
	return cfg, cfg.Validate()
}

func run(args []string, stdout, stderr io.Writer) error {
	o, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	log, err := o.Logger(stderr)
	if err != nil {
		return err
	}
	mb := &members{log: log}
	cfg, err := o.config()
	if err != nil {
		return err
	}
	envoyCfg, envoyOn, err := o.envoySection(&cfg)
	if err != nil {
		return err
	}
	cfg.Gossip.Membership = mb.start
	switch {
	case o.PrintConfig:
		if cfg.Gossip.Secret != "" {
			cfg.Gossip.Secret = "(redacted)"
		}
		return printJSON(stdout, cfg)
	case o.query != "":
		return queryMode(cfg.Listen[0], strings.Split(o.query, ","), stdout)
	case o.check:
		if err := check(cfg, log, stdout); err != nil {
			return err
		}
		return checkEnvoy(envoyCfg, envoyOn, stdout)
	}
	// Registered before any port is bound: a signal that comes while it
	// starts waits for serve instead of killing the process (room for
	// one of each).
	sigs := make(chan os.Signal, 3)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	defer signal.Stop(sigs)
	srv, err := start(cfg, log)
	if err != nil {
		return err
	}
	envoy, err := startEnvoy(envoyCfg, envoyOn, srv.Node(), cfg.WithDefaults().Gossip, log)
	if err != nil {
		srv.Shutdown(context.Background())
		return err
	}
	log.Info("throttled running", "default_rate", cfg.Default.Rate, "default_burst", cfg.Default.Burst,
		"rules", len(cfg.Rules), "gossip", cfg.Gossip.Listen, "peers", len(cfg.Gossip.Peers), "members", cfg.Gossip.Members != nil,
		"max_conns", cfg.MaxConns)
	return serve(srv, envoy, o, mb, log, sigs)
}

// start makes the server of cfg and starts it.
func start(cfg daemon.Config, log *slog.Logger) (*daemon.Server, error) {
	srv, err := daemon.New(cfg, log)
	if err != nil {
		return nil, err
	}
	if err := srv.Start(); err != nil {
		srv.Shutdown(context.Background())
		return nil, err
	}
	return srv, nil
}

// serve runs until SIGINT or SIGTERM, reloading on SIGHUP (the
// daemon's configuration, and the Envoy service's YAML files), then
// shuts the servers down.
func serve(srv *daemon.Server, envoy *envoyService, o *options, mb *members, log *slog.Logger, sigs <-chan os.Signal) error {
	for sig := range sigs {
		if sig == syscall.SIGHUP {
			reload(srv, o, mb, log)
			envoy.reload(o)
			continue
		}
		break
	}
	log.Info("shutting down")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	envoy.shutdown(ctx)
	if err := srv.Shutdown(ctx); err != nil {
		// Connections still open were closed: a clean stop all the same.
		log.Warn("shutdown: connections closed before their queries were answered", "err", err)
	}
	return nil
}

// reload rereads the configuration (file and flags) and the key file,
// and applies them; on any error the running configuration stays.
func reload(srv *daemon.Server, o *options, mb *members, log *slog.Logger) {
	cfg, err := o.config()
	cfg.Gossip.Membership = mb.start
	if err == nil {
		err = srv.Reload(cfg)
	}
	if err == nil && cfg.Gossip.KeyFile != "" {
		var keys [][]byte
		if keys, err = keyfile.Load(cfg.Gossip.KeyFile); err == nil {
			err = mb.rekey(keys)
		}
	}
	if err != nil {
		log.Error("SIGHUP: configuration refused, keeping the running one", "err", err)
	}
}

// check validates the configuration (already done by the caller: it
// binds nothing) and self-tests the daemon on a private loopback port
// with gossip off, so that it neither takes a live node's sockets nor
// sends anything to its peers.
func check(cfg daemon.Config, log *slog.Logger, out io.Writer) error {
	if err := cfg.CheckSecret(); err != nil {
		return err
	}
	test := cfg
	test.Listen = []string{"tcp:127.0.0.1:0"}
	test.Gossip = daemon.Gossip{}
	test.Admin = ""
	srv, err := start(test, log)
	if err != nil {
		return err
	}
	if err := selfTest(srv, out); err != nil {
		return err
	}
	peers := fmt.Sprintf("%d peer(s)", len(cfg.Gossip.Peers))
	if m := cfg.Gossip.Members; m != nil {
		peers = fmt.Sprintf("memberlist on %s and %d seed(s)", m.Bind, len(m.Seeds))
	}
	fmt.Fprintf(out, "configuration valid: %d listener(s), %d rule(s), gossip %s with %s\n",
		len(cfg.Listen), len(cfg.Rules), orNone(cfg.Gossip.Listen), peers)
	return nil
}

func orNone(s string) string {
	if s == "" {
		return "off"
	}
	return "on " + s
}

// queryMode asks the daemon at listen about tags, pipelined, and prints
// one "tag OK|NO" line per tag.
func queryMode(listen string, tags []string, out io.Writer) error {
	network, addr := "tcp", strings.TrimPrefix(listen, "tcp:")
	if a, ok := strings.CutPrefix(listen, "unix:"); ok {
		network, addr = "unix", a
	}
	c, err := client.New(network, addr, client.WithTimeout(2*time.Second), client.WithPolicy(failsafe.Closed))
	if err != nil {
		return err
	}
	defer c.Close()
	res := make([]bool, len(tags))
	if err := c.CheckMany(context.Background(), tags, res); err != nil {
		return err
	}
	for i, t := range tags {
		r := "NO"
		if res[i] {
			r = "OK"
		}
		fmt.Fprintf(out, "%s %s\n", t, r)
	}
	return nil
}

// selfTest queries the running server through the client until the
// default burst is spent, then stops it.
func selfTest(srv *daemon.Server, out io.Writer) error {
	defer srv.Shutdown(context.Background())
	addr := srv.Addrs()[0]
	c, err := client.New("tcp", addr.String(), client.WithTimeout(time.Second), client.WithPolicy(failsafe.Closed))
	if err != nil {
		return err
	}
	defer c.Close()
	ok, no := 0, 0
	for range 1000 {
		allowed, err := c.Check(context.Background(), "selftest")
		if err != nil {
			return fmt.Errorf("self-test: %w", err)
		}
		if !allowed {
			no++
			break
		}
		ok++
	}
	if no == 0 {
		return errors.New("self-test: never throttled")
	}
	fmt.Fprintf(out, "self-test passed: %s served %d queries, then throttled\n", addr, ok)
	return nil
}
