package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"reflect"
	"time"

	"github.com/throttlekit/throttle/distributed/daemon"
	"github.com/throttlekit/throttle/distributed/gossip"
	"github.com/throttlekit/throttle/extra/envoyrls"
	"github.com/throttlekit/throttle/internal/gcfloor"
)

// envoySection applies the -envoy-* flags to the configuration's "envoy"
// section and checks it; ok is false when there is none.
func (o *options) envoySection(cfg *daemon.Config) (c envoyrls.ServerConfig, ok bool, err error) {
	if len(cfg.Envoy) == 0 && o.envoyGRPC == "" && o.envoyConfig == "" {
		return c, false, nil
	}
	if len(cfg.Envoy) > 0 {
		if c, err = envoyrls.DecodeServerConfig(cfg.Envoy); err != nil {
			return c, true, err
		}
	}
	if o.envoyGRPC != "" {
		c.GRPC = o.envoyGRPC
	}
	if o.envoyConfig != "" {
		c.Config = o.envoyConfig
	}
	b, err := json.Marshal(c)
	if err != nil {
		return c, true, err
	}
	cfg.Envoy = b
	return c, true, c.Check()
}

// envoyService is the Envoy rate-limit service when configured: nil
// otherwise, and then its methods do nothing.
type envoyService struct {
	srv          *envoyrls.Server
	cfg          envoyrls.ServerConfig // the section it runs
	log          *slog.Logger
	gcStop, gcOK chan struct{} // the collector's floor: stop it, it stopped
}

// startEnvoy starts the service of the section, if any. The "gossip"
// backend shares the daemon's gossip node, with its routing; it is
// refused when the daemon does not gossip (no gossip.listen).
func startEnvoy(c envoyrls.ServerConfig, ok bool, node *gossip.Node, g daemon.Gossip, log *slog.Logger) (*envoyService, error) {
	if !ok {
		return nil, nil
	}
	var fleet *envoyrls.Fleet
	if node != nil && g.Listen != "" {
		fleet = envoyrls.NewFleet(node, envoyrls.FleetOptions{Owner: g.Routing == "owner",
			Owned: gossip.OwnedConfig{Timeout: time.Duration(g.ForwardTimeout), Delay: time.Duration(g.ForwardDelay)}})
	}
	srv, err := envoyrls.Start(c, log, fleet)
	if err != nil {
		return nil, err
	}
	cfg := srv.Service.Config()
	log.Info("envoy rate-limit service running", "grpc", srv.Addrs()[0].String(), "http", c.HTTP,
		"domains", len(cfg.Domains()), "rules", cfg.Rules(), "backend", c.Backend)
	e := &envoyService{srv: srv, cfg: c, log: log, gcStop: make(chan struct{}), gcOK: make(chan struct{})}
	// Each RLS request leaves grpc-go's and the Redis client's garbage:
	// the collector's goal is kept at 64 MiB or more while the service
	// runs (unless GOGC is set; see docs/ops/throttled.md). The daemon's
	// own line protocol allocates little, so without the service the
	// process keeps Go's default and its footprint.
	go func() { gcfloor.Run(time.Second, e.gcStop); close(e.gcOK) }()
	return e, nil
}

// reload rereads the YAML files; a refused version keeps the running
// one. A changed envoy section is reported: it needs a restart.
func (e *envoyService) reload(o *options) {
	if e == nil {
		return
	}
	if err := e.srv.Reload(); err != nil {
		e.log.Error("SIGHUP: envoy configuration refused, keeping the running one", "err", err)
	}
	cfg, err := o.config()
	if err != nil {
		return // reported by the daemon's reload
	}
	if c, _, err := o.envoySection(&cfg); err != nil || !reflect.DeepEqual(c, e.cfg) {
		e.log.Warn("SIGHUP: the envoy section changed; it applies at the next restart", "err", err)
	}
}

func (e *envoyService) shutdown(ctx context.Context) {
	if e != nil {
		e.srv.Shutdown(ctx)
		close(e.gcStop)
		<-e.gcOK
	}
}

// checkEnvoy loads the section's YAML files without serving them.
func checkEnvoy(c envoyrls.ServerConfig, ok bool, out io.Writer) error {
	if !ok {
		return nil
	}
	cfg, err := envoyrls.Load(c.Config, envoyrls.LoadOptions{MergeDomains: c.MergeDomains})
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "envoy configuration valid: %d domain(s), %d rule(s) from %s\n", len(cfg.Domains()), cfg.Rules(), c.Config)
	return nil
}
