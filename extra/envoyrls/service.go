package envoyrls

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strconv"
	"sync/atomic"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/throttlekit/throttle"
)

// ErrBadRequest is wrapped by the error of a request the service cannot
// answer: no domain, no descriptor, an override with an unknown unit. It
// wraps throttle.ErrInvalid; over gRPC it is InvalidArgument.
var ErrBadRequest = fmt.Errorf("envoyrls: bad request: %w", throttle.ErrInvalid)

// Options configure a Service. The zero value serves with an in-process
// backend, no response headers, and fails requests when the backend
// fails.
type Options struct {
	// Backend counts the hits (default: a new Memory).
	Backend Backend
	// ShadowMode answers OK whatever the descriptors' codes (the
	// reference's global SHADOW_MODE); statuses keep their codes.
	ShadowMode bool
	// ResponseHeaders adds the limit, remaining and reset headers of
	// the descriptor closest to its limit (the reference's
	// LIMIT_RESPONSE_HEADERS_ENABLED); the names default to
	// RateLimit-Limit, RateLimit-Remaining and RateLimit-Reset.
	ResponseHeaders                           bool
	LimitHeader, RemainingHeader, ResetHeader string
	// FailOpen answers OK (each status OK, no limit) when the backend
	// fails, instead of an Unavailable error that Envoy's own
	// failure_mode_deny then decides on.
	FailOpen bool
	// NearLimitRatio is the share of a limit past which hits count as
	// near the limit in the metrics (default 0.8).
	NearLimitRatio float64
	// KeyPrefix is put before every counter key (the reference's
	// CACHE_KEY_PREFIX).
	KeyPrefix string
	// MaxMetricSeries bounds the rule keys reported in the metrics
	// (default 1000); hits of keys past it are reported under "_other".
	MaxMetricSeries int
	// Now is the clock (default time.Now).
	Now func() time.Time
	// Logger gets backend failures (default: discarded).
	Logger *slog.Logger
}

// Service answers envoy.service.ratelimit.v3.RateLimitService. It is
// safe for concurrent use; setConfig swaps the configuration atomically
// (requests in flight finish on the one they started with).
type Service struct {
	rlsv3.UnimplementedRateLimitServiceServer
	cfg     atomic.Pointer[Config]
	o       Options
	metrics *metrics
}

// New returns a service answering from cfg (nil: no domain yet).
func newService(cfg *Config, o Options) *Service {
	if o.Backend == nil {
		o.Backend = NewMemory(0)
	}
	o.LimitHeader = cmp.Or(o.LimitHeader, "RateLimit-Limit")
	o.RemainingHeader = cmp.Or(o.RemainingHeader, "RateLimit-Remaining")
	o.ResetHeader = cmp.Or(o.ResetHeader, "RateLimit-Reset")
	o.NearLimitRatio = cmp.Or(o.NearLimitRatio, 0.8)
	o.MaxMetricSeries = cmp.Or(o.MaxMetricSeries, 1000)
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg == nil {
		cfg = &Config{}
	}
	s := &Service{o: o, metrics: newMetrics(o.MaxMetricSeries, o.NearLimitRatio)}
	s.cfg.Store(cfg)
	return s
}

// setConfig puts cfg in force for the requests that start after it.
func (s *Service) setConfig(cfg *Config) { s.cfg.Store(cfg) }

// Config is the configuration in force.
func (s *Service) Config() *Config { return s.cfg.Load() }

// Register adds the service to a gRPC server.
func (s *Service) Register(g grpc.ServiceRegistrar) { rlsv3.RegisterRateLimitServiceServer(g, s) }

// plan is a request's descriptors resolved to rules, the hits to charge
// and, once charged, their outcomes.
type plan struct {
	descs []planned // per descriptor
	hits  []hit
	out   []outcome // per hit
}

// planned is a descriptor resolved.
type planned struct {
	match     // limit nil when none applies
	unlimited bool
	at        int // its index in hits, or -1
}

// statusError is an error of ShouldRateLimit: gRPC clients get its code,
// a program calling the service in process can also test its cause with
// errors.Is (ErrBadRequest, throttle.ErrUnavailable).
type statusError struct {
	code codes.Code
	err  error
}

func (e *statusError) Error() string              { return e.err.Error() }
func (e *statusError) Unwrap() error              { return e.err }
func (e *statusError) GRPCStatus() *status.Status { return status.New(e.code, e.err.Error()) }

// ShouldRateLimit implements the RLS API. A request without a domain or
// a descriptor, or with an override of an unknown unit, fails with an
// error wrapping ErrBadRequest, InvalidArgument over gRPC; a failing
// backend (without Options.FailOpen) with one wrapping
// throttle.ErrUnavailable where the backend's does, Unavailable over
// gRPC.
func (s *Service) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	resp, err := s.decide(ctx, req)
	switch {
	case errors.Is(err, ErrBadRequest):
		return nil, &statusError{codes.InvalidArgument, err}
	case err != nil:
		return nil, &statusError{codes.Unavailable, err}
	}
	return resp, nil
}

// decide answers req; errors wrap ErrBadRequest, or are the backend's.
func (s *Service) decide(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	if req.GetDomain() == "" {
		return nil, fmt.Errorf("%w: rate limit domain must not be empty", ErrBadRequest)
	}
	if len(req.GetDescriptors()) == 0 {
		return nil, fmt.Errorf("%w: rate limit descriptor list must not be empty", ErrBadRequest)
	}
	p, err := s.plan(s.cfg.Load(), req)
	if err != nil {
		return nil, err
	}
	now := s.o.Now()
	if err := s.o.Backend.charge(ctx, now, p.hits, p.out); err != nil {
		s.metrics.backendError()
		s.o.Logger.Warn("rate-limit backend failed", "err", err, "fail_open", s.o.FailOpen)
		if !s.o.FailOpen {
			return nil, fmt.Errorf("envoyrls: backend: %w", err)
		}
		return failOpen(len(req.Descriptors)), nil
	}
	return s.respond(now, p), nil
}

func failOpen(n int) *rlsv3.RateLimitResponse {
	r := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK, Statuses: make([]*rlsv3.RateLimitResponse_DescriptorStatus, n)}
	for i := range r.Statuses {
		r.Statuses[i] = &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK}
	}
	return r
}

// plan resolves each descriptor, drops the unlimited and the replaced
// ones, and lists the hits to charge.
func (s *Service) plan(cfg *Config, req *rlsv3.RateLimitRequest) (plan, error) {
	n := len(req.Descriptors)
	p := plan{descs: make([]planned, n), hits: make([]hit, 0, n)}
	var replaced map[string]bool
	for i, d := range req.Descriptors {
		m, err := s.resolve(cfg, req.Domain, d)
		if err != nil {
			return plan{}, err
		}
		if m.limit != nil {
			for _, r := range m.limit.Replaces {
				if replaced == nil {
					replaced = map[string]bool{}
				}
				replaced[r] = true
			}
			if m.limit.Unlimited {
				p.descs[i].unlimited, m.limit = true, nil
			}
		}
		p.descs[i].match = m
	}
	for i, d := range req.Descriptors {
		m := &p.descs[i]
		m.at = -1
		if m.limit == nil || (m.limit.Name != "" && replaced[m.limit.Name]) {
			m.limit = nil
			continue
		}
		m.at = len(p.hits)
		p.hits = append(p.hits, hit{Key: counterKey(s.o.KeyPrefix, req.Domain, d.Entries, m.share), Limit: m.limit, N: hitsOf(req, d)})
	}
	p.out = make([]outcome, len(p.hits))
	return p, nil
}

// resolve finds a descriptor's rule, or its override's limit when it
// carries one (for a configured domain only, as the reference).
func (s *Service) resolve(cfg *Config, domain string, d *rlv3.RateLimitDescriptor) (match, error) {
	if cfg.domains[domain] == nil {
		return match{}, nil
	}
	if o := d.GetLimit(); o != nil {
		u := rlUnit(o.GetUnit())
		if u.Seconds() == 0 {
			return match{}, fmt.Errorf("%w: limit override with unit %v", ErrBadRequest, o.GetUnit())
		}
		key := detailedKey(domain, d.Entries, nil)
		return match{limit: &limitRule{Key: key, rlUnit: u, RequestsPerUnit: o.GetRequestsPerUnit()}, metric: key}, nil
	}
	m, _ := cfg.lookup(domain, d.Entries)
	return m, nil
}

// hitsOf is the descriptor's own hits_addend when set (0 included: a
// check that charges nothing), else the request's, 0 meaning 1.
func hitsOf(req *rlsv3.RateLimitRequest, d *rlv3.RateLimitDescriptor) uint64 {
	if h := d.GetHitsAddend(); h != nil {
		return h.GetValue()
	}
	return uint64(max(1, req.GetHitsAddend()))
}

// statusBlock is the messages of a descriptor's status, allocated
// together with the other descriptors' (one allocation per response).
type statusBlock struct {
	st  rlsv3.RateLimitResponse_DescriptorStatus
	lim rlsv3.RateLimitResponse_RateLimit
	dur durationpb.Duration
}

// status fills b with a descriptor's status from its outcome.
func (b *statusBlock) status(l *limitRule, o outcome) *rlsv3.RateLimitResponse_DescriptorStatus {
	b.lim.Name, b.lim.RequestsPerUnit, b.lim.Unit = l.Name, l.RequestsPerUnit, rlsv3.RateLimitResponse_RateLimit_Unit(l.rlUnit)
	b.dur.Seconds, b.dur.Nanos = int64(o.Reset/time.Second), int32(o.Reset%time.Second)
	st := &b.st
	st.Code, st.CurrentLimit, st.LimitRemaining, st.DurationUntilReset = rlsv3.RateLimitResponse_OK, &b.lim, o.Remaining, &b.dur
	if o.Over && !l.ShadowMode {
		st.Code = rlsv3.RateLimitResponse_OVER_LIMIT
	}
	return st
}

// respond builds the response: OVER_LIMIT if any descriptor is over its
// limit (not in shadow mode), or if every quota-mode descriptor is.
func (s *Service) respond(now time.Time, p plan) *rlsv3.RateLimitResponse {
	r := &rlsv3.RateLimitResponse{Statuses: make([]*rlsv3.RateLimitResponse_DescriptorStatus, len(p.descs))}
	blocks := make([]statusBlock, len(p.descs))
	closest, least := (*rlsv3.RateLimitResponse_DescriptorStatus)(nil), uint32(math.MaxUint32)
	over, quota, quotaOver := 0, 0, 0
	for i, m := range p.descs {
		switch {
		case m.unlimited, m.limit == nil:
			st := &blocks[i].st
			st.Code = rlsv3.RateLimitResponse_OK
			if m.unlimited {
				st.LimitRemaining = math.MaxUint32
			}
			r.Statuses[i] = st
			continue
		}
		o, hit := p.out[m.at], p.hits[m.at]
		st := blocks[i].status(m.limit, o)
		s.metrics.record(m.metric, m.limit, hit.N, o)
		r.Statuses[i] = st
		if st.LimitRemaining < least {
			closest, least = st, st.LimitRemaining
		}
		if m.limit.QuotaMode {
			quota++
		}
		if st.Code == rlsv3.RateLimitResponse_OVER_LIMIT {
			if m.limit.QuotaMode {
				quotaOver++
			} else {
				over++
				closest, least = st, 0
			}
		}
	}
	r.OverallCode = rlsv3.RateLimitResponse_OK
	if over > 0 || (quota > 0 && quota == quotaOver) {
		r.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
	}
	if s.o.ResponseHeaders && closest != nil {
		r.ResponseHeadersToAdd = s.headers(now, closest)
	}
	if r.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT && s.o.ShadowMode {
		r.OverallCode = rlsv3.RateLimitResponse_OK
		s.metrics.globalShadow()
	}
	return r
}

// headers are the x-ratelimit-style headers of st: its limit, what
// remains, and the seconds until its unit's window ends.
func (s *Service) headers(now time.Time, st *rlsv3.RateLimitResponse_DescriptorStatus) []*corev3.HeaderValue {
	d := rlUnit(st.CurrentLimit.Unit).Seconds()
	reset := d - now.Unix()%d
	return []*corev3.HeaderValue{
		{Key: s.o.LimitHeader, Value: strconv.FormatUint(uint64(st.CurrentLimit.RequestsPerUnit), 10)},
		{Key: s.o.RemainingHeader, Value: strconv.FormatUint(uint64(st.LimitRemaining), 10)},
		{Key: s.o.ResetHeader, Value: strconv.FormatInt(reset, 10)},
	}
}
