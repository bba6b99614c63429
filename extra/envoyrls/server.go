package envoyrls

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/throttlekit/throttle/internal/conffile"
)

// ServerConfig is the "envoy" section of throttled's configuration: what
// Start serves, and from which files.
type ServerConfig struct {
	// GRPC is the address of the RLS gRPC listener, e.g. "0.0.0.0:8081"
	// (the reference's GRPC_PORT). Required.
	GRPC string `json:"grpc"`
	// HTTP is an optional address serving /json, /healthcheck and
	// /metrics (the reference's PORT, 8080).
	HTTP string `json:"http,omitempty"`
	// Config is the reference's YAML configuration: a file, or a
	// directory whose files are all loaded (dot files skipped). Required.
	Config string `json:"config"`
	// MergeDomains merges the files that configure one domain (the
	// reference's MERGE_DOMAIN_CONFIG) instead of refusing them.
	MergeDomains bool `json:"merge_domains,omitempty"`
	// Watch is how often the files are looked at for a change (a Go
	// duration; default "5s", "off" for SIGHUP only).
	Watch string `json:"watch,omitempty"`
	// ShadowMode is the global shadow mode (SHADOW_MODE).
	ShadowMode bool `json:"shadow_mode,omitempty"`
	// ResponseHeaders adds the RateLimit-* headers (see Options).
	ResponseHeaders bool   `json:"response_headers,omitempty"`
	LimitHeader     string `json:"limit_header,omitempty"`
	RemainingHeader string `json:"remaining_header,omitempty"`
	ResetHeader     string `json:"reset_header,omitempty"`
	// FailOpen answers OK when the backend is down (see Options).
	FailOpen bool `json:"fail_open,omitempty"`
	// KeyPrefix prefixes the counter keys (CACHE_KEY_PREFIX).
	KeyPrefix string `json:"key_prefix,omitempty"`
	// NearLimitRatio is NEAR_LIMIT_RATIO (default 0.8).
	NearLimitRatio float64 `json:"near_limit_ratio,omitempty"`
	// Backend is "memory" (the default: this process alone), "redis"
	// (see Redis), or "gossip" (see Fleet: the limits shared with the
	// other throttled daemons through the daemon's own gossip node, with
	// its routing).
	Backend string `json:"backend,omitempty"`
	// Redis configures the "redis" backend.
	Redis *RedisConfig `json:"redis,omitempty"`
	// MaxKeys bounds the "memory" backend's fixed-window counters (see
	// NewMemory; default 1,000,000).
	MaxKeys int `json:"max_keys,omitempty"`
}

// parseServerConfig reads the section strictly (unknown fields and keys
// given twice are refused) and checks it. Errors wrap ErrInvalidConfig.
func parseServerConfig(b []byte) (ServerConfig, error) {
	c, err := DecodeServerConfig(b)
	if err != nil {
		return c, err
	}
	return c, c.Check()
}

// DecodeServerConfig reads the section strictly, without checking it
// (for a program that sets some fields from its flags first).
func DecodeServerConfig(b []byte) (ServerConfig, error) {
	var c ServerConfig
	if err := conffile.Decode(b, &c); err != nil {
		return c, fmt.Errorf("%w: envoy: %v", ErrInvalidConfig, err)
	}
	return c, nil
}

// Check validates the section without reading the files.
func (c ServerConfig) Check() error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: envoy: %s", ErrInvalidConfig, fmt.Sprintf(format, a...))
	}
	if err := conffile.CheckHostPort(c.GRPC, true); err != nil {
		return bad("grpc %q: %v", c.GRPC, err)
	}
	if c.HTTP != "" {
		if err := conffile.CheckHostPort(c.HTTP, true); err != nil {
			return bad("http %q: %v", c.HTTP, err)
		}
	}
	if c.Config == "" {
		return bad("config: no file or directory named")
	}
	if _, err := c.watchInterval(); err != nil {
		return bad("watch %q: %v", c.Watch, err)
	}
	if c.MaxKeys < 0 {
		return bad("max_keys %d: want 0 (the default) or more", c.MaxKeys)
	}
	if c.NearLimitRatio < 0 || c.NearLimitRatio > 1 {
		return bad("near_limit_ratio %v: want a number in [0, 1]", c.NearLimitRatio)
	}
	switch c.Backend {
	case "", "memory", "gossip":
	case "redis":
		if c.Redis == nil || len(c.Redis.Addrs) == 0 {
			return bad("backend redis: redis.addrs is empty")
		}
	default:
		return bad("backend %q: want memory, redis or gossip", c.Backend)
	}
	return nil
}

func (c ServerConfig) watchInterval() (time.Duration, error) {
	switch c.Watch {
	case "":
		return 5 * time.Second, nil
	case "off":
		return 0, nil
	}
	d, err := time.ParseDuration(c.Watch)
	if err == nil && d <= 0 {
		err = errors.New("want a positive duration or off")
	}
	return d, err
}

// Server runs a Service on its listeners for a ServerConfig. Its gRPC
// server decodes and encodes the RLS messages with a codec of its own
// (the proto codec's messages and bytes, with fewer allocations) and
// static flow-control windows. Safe for concurrent use.
type Server struct {
	Service *Service
	src     *Source
	grpc    *grpc.Server
	health  *health.Server
	http    *http.Server
	addrs   []net.Addr
	cancel  context.CancelFunc
	closers []func() error
	wg      sync.WaitGroup
	stopped atomic.Bool
}

// Start loads the configuration files, binds the listeners and serves.
// fleet is the backend "gossip" uses (nil otherwise); log gets the
// refused reloads and backend failures (nil: discarded).
func Start(c ServerConfig, log *slog.Logger, fleet *Fleet) (*Server, error) {
	if err := c.Check(); err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Server{}
	backend, closer, err := c.backend(fleet)
	if err != nil {
		return nil, err
	}
	s.closers = append(s.closers, closer)
	svc, src, err := Open(c.Config, LoadOptions{MergeDomains: c.MergeDomains}, c.options(backend, log))
	if err != nil {
		closer()
		return nil, err
	}
	s.Service, s.src = svc, src
	src.OnError = func(err error) { log.Error("envoy: configuration refused, keeping the running one", "err", err) }
	if err := s.listen(c); err != nil {
		s.Shutdown(context.Background())
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	if d, _ := c.watchInterval(); d > 0 {
		s.wg.Go(func() { src.Watch(ctx, d) })
	}
	return s, nil
}

func (c ServerConfig) options(b Backend, log *slog.Logger) Options {
	return Options{
		Backend: b, ShadowMode: c.ShadowMode, ResponseHeaders: c.ResponseHeaders,
		LimitHeader: c.LimitHeader, RemainingHeader: c.RemainingHeader, ResetHeader: c.ResetHeader,
		FailOpen: c.FailOpen, KeyPrefix: c.KeyPrefix, NearLimitRatio: c.NearLimitRatio, Logger: log,
	}
}

func (c ServerConfig) backend(fleet *Fleet) (Backend, func() error, error) {
	switch c.Backend {
	case "gossip":
		if fleet == nil {
			return nil, nil, fmt.Errorf("%w: envoy: backend gossip needs a gossip node (the daemon's gossip.listen)", ErrInvalidConfig)
		}
		return fleet, fleet.Close, nil
	case "redis":
		r, err := NewRedis(*c.Redis)
		if err != nil {
			return nil, nil, err
		}
		return r, r.Close, nil
	}
	m := NewMemory(c.MaxKeys)
	return m, m.Close, nil
}

// streamWorkers are the goroutines that serve the gRPC requests, their
// stacks grown once (gRPC starts one per request when all are busy).
// Starting one per request spent a tenth of the server's CPU growing
// stacks (docs/performance.md).
const streamWorkers = 64

// newGRPCServer is the gRPC server the service is registered on, with
// its stream workers and its codec, and static flow-control windows:
// with the default dynamic ones, grpc-go pings the client to estimate the
// bandwidth-delay product whenever data arrives and no ping is out, about
// once per request at low concurrency (a write and a read more, and a
// wake-up of each side), for messages of a few hundred bytes that no
// window would hold back.
func newGRPCServer() *grpc.Server {
	return grpc.NewServer(grpc.NumStreamWorkers(streamWorkers), grpc.ForceServerCodecV2(serverCodec),
		grpc.StaticStreamWindowSize(streamWindow), grpc.StaticConnWindowSize(connWindow))
}

// The flow-control windows: a stream's (the HTTP/2 default), and a
// connection's, which Envoy shares among all its calls.
const (
	streamWindow = 64 << 10
	connWindow   = 1 << 20
)

// listen binds the gRPC listener (with the gRPC health service) and the
// optional HTTP one, and serves them.
func (s *Server) listen(c ServerConfig) error {
	gl, err := net.Listen("tcp", c.GRPC)
	if err != nil {
		return fmt.Errorf("envoy: grpc: %w", err)
	}
	s.grpc = newGRPCServer()
	s.Service.Register(s.grpc)
	s.health = health.NewServer()
	healthpb.RegisterHealthServer(s.grpc, s.health)
	s.addrs = append(s.addrs, gl.Addr())
	s.wg.Go(func() { s.grpc.Serve(gl) })
	if c.HTTP == "" {
		return nil
	}
	hl, err := net.Listen("tcp", c.HTTP)
	if err != nil {
		return fmt.Errorf("envoy: http: %w", err)
	}
	s.http = &http.Server{Handler: s.Service.Handler(func() bool { return !s.stopped.Load() }), ReadHeaderTimeout: 10 * time.Second}
	s.addrs = append(s.addrs, hl.Addr())
	s.wg.Go(func() { s.http.Serve(hl) })
	return nil
}

// Addrs are the bound addresses: gRPC, then HTTP if configured.
func (s *Server) Addrs() []net.Addr { return s.addrs }

// Reload reads the configuration files again (see Source.Reload).
func (s *Server) Reload() error { return s.src.Reload() }

// Shutdown marks the server unhealthy, finishes the requests in flight
// (until ctx ends, then closes them), and releases the backend.
func (s *Server) Shutdown(ctx context.Context) error {
	s.stopped.Store(true)
	if s.health != nil {
		s.health.Shutdown()
	}
	if s.cancel != nil {
		s.cancel()
	}
	var err error
	if s.http != nil {
		err = s.http.Shutdown(ctx)
	}
	if s.grpc != nil {
		done := make(chan struct{})
		go func() { s.grpc.GracefulStop(); close(done) }()
		select {
		case <-done:
		case <-ctx.Done():
			s.grpc.Stop()
			err = ctx.Err()
		}
	}
	s.wg.Wait()
	for _, c := range s.closers {
		c()
	}
	return err
}
