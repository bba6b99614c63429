package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/throttlekit/throttle/distributed/capacity"
	"github.com/throttlekit/throttle/distributed/capacity/etcdelection"
)

// app is a running capacityd: the capacity server, its API and admin
// listeners, its part in the election and the configuration watcher.
type app struct {
	log       *slog.Logger
	opts      *options
	srv       *capacity.Server
	met       *metrics
	advertise string // API address known to clients and replicas

	cur      atomic.Pointer[settings]
	lead     atomic.Pointer[capacity.Leadership] // nil until the election reports
	stopping atomic.Bool

	api, admin     *http.Server
	grpc           *grpc.Server // nil without grpc_listen
	apiLn, adminLn net.Listener
	grpcLn         net.Listener
	etcd           *clientv3.Client

	stop    context.CancelFunc // ends the election and the watcher
	runDone chan struct{}      // closed when Server.Run has returned
	bg      sync.WaitGroup     // listeners and watcher

	reloadMu sync.Mutex
	lastFile []byte // the file's contents last read by a reload
}

func newCapacityServer(s *settings) (*capacity.Server, error) {
	opts := append([]capacity.ServerOption{capacity.WithDecreaseGrace(s.grace)}, s.file.Limits.options()...)
	if len(s.file.Parent) > 0 {
		id := s.parentID
		if id == "" {
			id = s.file.Advertise
			if id == "" {
				id = s.file.Listen
			}
			id = "capacityd " + id
		}
		opts = append(opts, capacity.WithParent(s.parent, s.file.Parent, capacity.WithClientID(id)))
	}
	if s.leaseKeys != nil {
		opts = append(opts, capacity.WithLeaseKeys(s.leaseKeys...))
	}
	return capacity.NewServer(s.resources, opts...)
}

// start binds the listeners, joins the election and serves. When it
// returns without error the server is serving.
func start(o *options, s *settings, raw []byte, log *slog.Logger) (a *app, err error) {
	srv, err := newCapacityServer(s)
	if err != nil {
		return nil, err
	}
	a = &app{log: log, opts: o, srv: srv, lastFile: raw, runDone: make(chan struct{})}
	a.cur.Store(s)
	a.met = newMetrics(a)
	defer func() {
		if err != nil {
			a.closeAll()
		}
	}()
	if err = a.listen(s); err != nil {
		return nil, err
	}
	election, err := a.joinElection(s)
	if err != nil {
		return nil, err
	}
	a.api = a.apiServer(s)
	ctx, cancel := context.WithCancel(context.Background())
	a.stop = cancel
	a.run(ctx, election)
	a.serveAll(s)
	if o.ConfigPath != "" && o.watch > 0 {
		a.bg.Add(1)
		go a.watch(ctx, o.watch)
	}
	log.Info("capacityd serving", "listen", a.apiLn.Addr().String(), "advertise", a.advertise,
		"grpc", addrOf(a.grpcLn), "admin", addrOf(a.adminLn), "templates", len(s.resources.Resources), "election", electionName(s))
	return a, nil
}

// listen binds the API port and, if configured, the admin and gRPC ports,
// and settles the address advertised.
func (a *app) listen(s *settings) (err error) {
	if a.apiLn, err = net.Listen("tcp", s.file.Listen); err != nil {
		return err
	}
	if s.file.Admin != "" {
		if a.adminLn, err = net.Listen("tcp", s.file.Admin); err != nil {
			return err
		}
	}
	if s.file.GRPCListen != "" {
		if a.grpcLn, err = net.Listen("tcp", s.file.GRPCListen); err != nil {
			return err
		}
	}
	a.advertise = s.file.Advertise
	if a.advertise == "" {
		a.advertise = a.apiLn.Addr().String()
	}
	return nil
}

// joinElection is the election the server runs in: etcd's when
// configured, else it is the master alone.
func (a *app) joinElection(s *settings) (capacity.Election, error) {
	e := s.file.Etcd
	if e == nil {
		return capacity.Solo{}, nil
	}
	var err error
	a.etcd, err = clientv3.New(clientv3.Config{Endpoints: e.Endpoints, DialTimeout: s.dial, Logger: zap.NewNop()})
	if err != nil {
		return nil, err
	}
	return etcdelection.New(a.etcd, s.prefix(), etcdelection.WithTTL(s.ttl))
}

// apiServer is the HTTP server of the API port: Connect, gRPC and gRPC-Web
// over HTTP/1 and HTTP/2 (without TLS, h2c).
func (a *app) apiServer(s *settings) *http.Server {
	var protocols http.Protocols
	protocols.SetHTTP1(true)
	protocols.SetUnencryptedHTTP2(true) // gRPC without TLS
	var api http.Handler = capacity.NewHandler(a.srv, connect.WithInterceptors(a.met.interceptor()))
	if s.auth.auth != nil {
		api = capacity.Authenticated(api, s.auth.auth)
	}
	srv := newHTTPServer(api, s.http, s.http.idle)
	if s.auth.tls != nil {
		protocols = http.Protocols{}
		protocols.SetHTTP1(true)
		protocols.SetHTTP2(true)
		srv.TLSConfig = s.auth.tls
	}
	srv.Protocols = &protocols
	srv.ErrorLog = slog.NewLogLogger(a.log.Handler(), slog.LevelDebug)
	return srv
}

// run runs the server in election until ctx is done, and returns once
// the election has reported the server's first leadership, or after
// startGrace as a server that is not the master, waiting for the
// election to report: only then may requests come in. A server that is
// the master alone (capacity.Solo) is thus the master before it serves
// (it answered its first requests "not the master" before).
func (a *app) run(ctx context.Context, election capacity.Election) {
	started := make(chan struct{})
	var once sync.Once
	release := func() { once.Do(func() { close(started) }) }
	go func() {
		defer close(a.runDone)
		defer release() // the election ended without a report
		err := a.srv.Run(ctx, observed{e: election, a: a, started: release}, a.advertise)
		if err != nil && !errors.Is(err, context.Canceled) {
			a.log.Error("election ended", "err", err)
		}
	}()
	<-started
}

// startGrace bounds how long run waits for the election's first report.
const startGrace = 100 * time.Millisecond

// serveAll serves the ports listen bound, each capped in connections;
// both API ports count toward one bound.
func (a *app) serveAll(s *settings) {
	apiConns := new(atomic.Int64)
	apiLn := a.capped(a.apiLn, "api", s.http.maxConns, apiConns)
	if s.auth.tls != nil {
		apiLn = tls.NewListener(apiLn, s.auth.tls)
	}
	var grpcLn *recvDeadline
	if a.grpcLn != nil {
		grpcLn = &recvDeadline{Listener: a.capped(a.grpcLn, "grpc", s.http.maxConns, apiConns),
			read: s.http.read, cut: a.met.cut.Inc}
		// grpc-go does its own TLS handshake, with a copy of the TLS
		// configuration made before the API's server starts changing it.
		a.grpc = newGRPCServer(a.srv, s, a.met, grpcLn)
	}
	a.serveOn(a.api, apiLn)
	if a.grpcLn != nil {
		a.bg.Go(func() {
			if err := a.grpc.Serve(grpcLn); err != nil {
				a.log.Error("serve", "addr", grpcLn.Addr().String(), "err", err)
			}
		})
	}
	if a.adminLn != nil {
		a.admin = newHTTPServer(a.adminHandler(), s.http, min(s.http.idle, 30*time.Second))
		a.admin.ErrorLog = slog.NewLogLogger(a.log.Handler(), slog.LevelDebug)
		a.serveOn(a.admin, a.capped(a.adminLn, "admin", s.http.adminMaxConns, new(atomic.Int64)))
	}
}

func (a *app) serveOn(srv *http.Server, ln net.Listener) {
	a.bg.Add(1)
	go func() {
		defer a.bg.Done()
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			a.log.Error("serve", "addr", ln.Addr().String(), "err", err)
		}
	}()
}

// capped bounds ln's connections open at once, counted in open, to max.
func (a *app) capped(ln net.Listener, name string, max int, open *atomic.Int64) net.Listener {
	c := a.met.refused.WithLabelValues(name)
	return &capListener{Listener: ln, max: int64(max), open: open, refused: c.Inc}
}

func addrOf(ln net.Listener) string {
	if ln == nil {
		return "off"
	}
	return ln.Addr().String()
}

func electionName(s *settings) string {
	if s.file.Etcd == nil {
		return "solo"
	}
	return "etcd " + s.prefix()
}

// observed is an Election that tells the app about changes of leadership,
// and lets run return (started) at the first or after startGrace.
type observed struct {
	e       capacity.Election
	a       *app
	started func()
}

func (o observed) Campaign(ctx context.Context, address string, report func(capacity.Leadership)) error {
	t := time.AfterFunc(startGrace, o.started)
	defer t.Stop()
	return o.e.Campaign(ctx, address, func(l capacity.Leadership) {
		report(l)
		o.a.setLeadership(l)
		o.started()
	})
}

func (a *app) setLeadership(l capacity.Leadership) {
	old := a.lead.Swap(&l)
	switch {
	case old != nil && *old == l:
	case l.IsMaster:
		a.log.Info("master: serving, learning what clients hold", "term", l.Term)
	case l.Master != "":
		a.log.Info("follower: redirecting to the master", "master", l.Master, "term", l.Term)
	default:
		a.log.Warn("master unknown: granting nothing")
	}
}

// shutdown stops accepting connections, finishes the requests in flight
// (until ctx is done), gives up mastership and closes everything.
func (a *app) shutdown(ctx context.Context) {
	a.stopping.Store(true)
	if err := a.api.Shutdown(ctx); err != nil {
		a.log.Warn("shutdown: requests still in flight were cut off", "err", err)
		a.api.Close()
	}
	if a.grpc != nil {
		stopGRPC(ctx, a.grpc)
	}
	a.stop()
	<-a.runDone
	a.lead.Store(nil)
	if a.admin != nil {
		if err := a.admin.Shutdown(ctx); err != nil {
			a.admin.Close()
		}
	}
	a.bg.Wait()
	a.closeAll()
	a.log.Info("stopped")
}

// closeAll closes what start opened; for a failed start, and after
// shutdown.
func (a *app) closeAll() {
	if a.stop != nil {
		a.stop()
		<-a.runDone
	}
	for _, ln := range []net.Listener{a.apiLn, a.adminLn, a.grpcLn} {
		if ln != nil {
			ln.Close()
		}
	}
	if a.etcd != nil {
		a.etcd.Close()
	}
	a.srv.Close() // a child gives its parent leases back
}

// watch reloads the configuration when the file's contents change,
// looking every interval, until ctx is done. New contents must be the
// same at two looks in a row, so that a file caught while being written
// is not loaded (nor refused).
func (a *app) watch(ctx context.Context, interval time.Duration) {
	defer a.bg.Done()
	t := time.NewTicker(interval)
	defer t.Stop()
	var pending []byte
	havePending := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		raw, err := os.ReadFile(a.opts.ConfigPath)
		if err != nil {
			raw = nil
		}
		a.reloadMu.Lock()
		same := bytes.Equal(raw, a.lastFile)
		a.reloadMu.Unlock()
		switch {
		case same:
			havePending = false
		case !havePending || !bytes.Equal(raw, pending):
			pending, havePending = raw, true
		default:
			havePending = false
			a.reload("file changed")
		}
	}
}

// reload rereads the configuration (file and flags) and applies its
// resource templates. On any error the running configuration stays.
func (a *app) reload(why string) {
	a.reloadMu.Lock()
	defer a.reloadMu.Unlock()
	s, raw, err := a.opts.settings()
	a.lastFile = raw
	if err == nil {
		if what := a.cur.Load().restartNeeded(s); what != "" {
			err = errors.New("the new configuration changes " + what + ", which needs a restart")
		}
	}
	if err == nil {
		err = a.srv.SetConfig(s.resources)
	}
	if err != nil {
		a.met.reloads.WithLabelValues("refused").Inc()
		a.log.Error("configuration refused, keeping the running one", "trigger", why, "err", err)
		return
	}
	a.cur.Store(s)
	a.met.reloads.WithLabelValues("applied").Inc()
	a.log.Info("configuration reloaded", "trigger", why, "templates", len(s.resources.Resources))
}
