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
// shows the default). It stops cleanly on SIGINT or SIGTERM.
package main

import (
	"context"
	"errors"
	"flag"
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
)

func main() {
	if err := run(os.Args[1:], os.Stdout, os.Stderr); err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, "throttled:", err)
		}
		os.Exit(2)
	}
}

type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, ",") }
func (l *listFlag) Set(s string) error { *l = append(*l, strings.Split(s, ",")...); return nil }

func run(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("throttled", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		configPath  = fs.String("config", "", "JSON configuration file (default: the embedded one, see -print-config)")
		printConfig = fs.Bool("print-config", false, "print the effective configuration as JSON and exit")
		check       = fs.Bool("check", false, "self-test: start on a free loopback port, query it, stop, and exit")
		rate        = fs.String("rate", "", "default rate for every tag, e.g. 100/s (overrides the config)")
		burst       = fs.Int("burst", 0, "default burst (overrides the config)")
		gossipAddr  = fs.String("gossip", "", "UDP address to gossip on, e.g. 0.0.0.0:7946 (overrides the config)")
		advertise   = fs.String("advertise", "", "gossip address the peers know this daemon by, when -gossip binds a wildcard (overrides the config)")
		interval    = fs.Duration("interval", 0, "gossip interval (overrides the config)")
		secretFile  = fs.String("secret-file", "", "file holding the gossip secret (or set THROTTLED_SECRET)")
		spendCap    = fs.Bool("spend-cap", false, "enable the per-node spend cap")
		logLevel    = fs.String("log-level", "info", "debug, info, warn or error")
		logJSON     = fs.Bool("log-json", false, "log JSON instead of text")
		query       = fs.String("query", "", "client mode: ask the daemon at the first listen address about these comma-separated tags, print the replies, and exit")
		listen      listFlag
		peers       listFlag
	)
	fs.Var(&listen, "listen", "socket to serve on, tcp:HOST:PORT or unix:PATH (repeatable; overrides the config)")
	fs.Var(&peers, "peers", "gossip peers, comma separated HOST:PORT (overrides the config)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		return err
	}
	hopts := &slog.HandlerOptions{Level: level}
	var log *slog.Logger
	if *logJSON {
		log = slog.New(slog.NewJSONHandler(stderr, hopts))
	} else {
		log = slog.New(slog.NewTextHandler(stderr, hopts))
	}

	cfg := daemon.DefaultConfig()
	if *configPath != "" {
		var err error
		if cfg, err = daemon.LoadConfig(*configPath); err != nil {
			return err
		}
	}
	if len(listen) > 0 {
		cfg.Listen = listen
	}
	if *rate != "" {
		cfg.Default.Rate = *rate
	}
	if *burst != 0 {
		cfg.Default.Burst = *burst
	}
	if *gossipAddr != "" {
		cfg.Gossip.Listen = *gossipAddr
	}
	if *advertise != "" {
		cfg.Gossip.Advertise = *advertise
	}
	if len(peers) > 0 {
		cfg.Gossip.Peers = peers
	}
	if *interval != 0 {
		cfg.Gossip.Interval = daemon.Duration(*interval)
	}
	if *secretFile != "" {
		cfg.Gossip.SecretFile = *secretFile
	}
	if *spendCap {
		cfg.Gossip.SpendCap = true
	}
	if *check {
		cfg.Listen = []string{"tcp:127.0.0.1:0"}
	}
	if err := cfg.Validate(); err != nil {
		return err
	}
	if *printConfig {
		if cfg.Gossip.Secret != "" {
			cfg.Gossip.Secret = "(redacted)"
		}
		return printJSON(stdout, cfg)
	}
	if *query != "" {
		return queryMode(cfg.Listen[0], strings.Split(*query, ","), stdout)
	}

	srv, err := daemon.New(cfg, log)
	if err != nil {
		return err
	}
	if err := srv.Start(); err != nil {
		srv.Shutdown(context.Background())
		return err
	}
	if *check {
		return selfTest(srv, stdout)
	}
	log.Info("throttled running", "default_rate", cfg.Default.Rate, "default_burst", cfg.Default.Burst,
		"rules", len(cfg.Rules), "gossip", cfg.Gossip.Listen, "peers", len(cfg.Gossip.Peers))

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	<-ctx.Done()
	stop()
	log.Info("shutting down")
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return srv.Shutdown(sctx)
}

// queryMode asks the daemon at listen about tags, pipelined, and prints
// one "tag OK|NO" line per tag.
func queryMode(listen string, tags []string, out io.Writer) error {
	network, addr := "tcp", strings.TrimPrefix(listen, "tcp:")
	if a, ok := strings.CutPrefix(listen, "unix:"); ok {
		network, addr = "unix", a
	}
	c, err := client.New(network, addr, client.WithTimeout(2*time.Second), client.FailClosed())
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
	c, err := client.New("tcp", addr.String(), client.WithTimeout(time.Second), client.FailClosed())
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
