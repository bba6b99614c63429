// Command capacityd is the capacity-lease server: it divides the capacity
// of resources among the clients that ask for it and hands each a lease
// (package github.com/throttlekit/throttle/distributed/capacity), served
// over gRPC, gRPC-Web and Connect with JSON bodies on one port.
//
// With no flags it serves the embedded default configuration (every
// resource: capacity 100, fair share) on 127.0.0.1:7400, with /healthz,
// /metrics (Prometheus) and /status (an HTML page) on 127.0.0.1:7401:
//
//	go run ./cmd/capacityd
//	curl -H 'Content-Type: application/json' \
//	  -d '{"clientId":"c1","resources":[{"resourceId":"db","wants":10}]}' \
//	  http://127.0.0.1:7400/throttle.capacity.v1.CapacityService/GetCapacity
//
// The configuration file (-config, JSON; -print-config shows the
// effective configuration, which -config reads back) holds the server's
// addresses, an optional etcd election (several replicas, one master,
// the others redirect to it) and the resource templates. -check validates
// it and binds nothing. The file is watched: when its contents change,
// and on SIGHUP, the resource templates are reloaded; an invalid file, or
// one that changes what needs a restart (addresses, etcd), is refused with
// a log line and the running configuration stays. SIGINT or SIGTERM stop
// it cleanly (exit 0): it stops accepting connections, finishes the
// requests in flight and gives up mastership, so that another replica
// takes over at once.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/throttlekit/throttle/internal/cmdkit"
	"github.com/throttlekit/throttle/internal/gcfloor"
)

func main() {
	floorProcs()
	go gcfloor.Run(time.Second, nil)
	cmdkit.Main("capacityd", run)
}

// options are the command line.
type options struct {
	cmdkit.Flags
	listen, admin, advertise string
	watch, shutdownTimeout   time.Duration
	check                    bool
}

func parseFlags(args []string, stderr io.Writer) (*options, error) {
	o := &options{}
	fs := o.FlagSet("capacityd", stderr)
	fs.BoolVar(&o.check, "check", false, "validate the configuration and exit, binding nothing")
	fs.StringVar(&o.listen, "listen", "", "API address, e.g. 127.0.0.1:7400 (overrides the config)")
	fs.StringVar(&o.admin, "admin", "", "HTTP address for /healthz, /metrics and /status (overrides the config)")
	fs.StringVar(&o.advertise, "advertise", "", "API address clients and replicas know this server by (overrides the config)")
	fs.DurationVar(&o.watch, "watch", time.Second, "how often to look for a changed configuration file; 0 only reloads on SIGHUP")
	fs.DurationVar(&o.shutdownTimeout, "shutdown-timeout", 10*time.Second, "how long a stop waits for requests in flight")
	if err := cmdkit.Parse(fs, args); err != nil {
		return nil, err
	}
	if o.watch < 0 || o.shutdownTimeout <= 0 {
		return nil, errors.New("-watch must be >= 0 and -shutdown-timeout > 0")
	}
	return o, nil
}

// settings reads the configuration file (or the embedded default),
// applies the flags over it and validates the result. It also returns the
// file's contents, for the watcher to compare.
func (o *options) settings() (*settings, []byte, error) {
	f, raw, err := loadFile(o.ConfigPath)
	if err != nil {
		return nil, raw, err
	}
	if o.listen != "" {
		f.Listen = o.listen
	}
	if o.admin != "" {
		f.Admin = o.admin
	}
	if o.advertise != "" {
		f.Advertise = o.advertise
	}
	s, err := f.validate()
	return s, raw, err
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
	s, raw, err := o.settings()
	if err != nil {
		return err
	}
	switch {
	case o.PrintConfig:
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(s.file)
	case o.check:
		return check(s, stdout)
	}
	// Registered before any port is bound: a signal that comes while it
	// starts waits for serve instead of killing the process (room for
	// one of each).
	sigs := make(chan os.Signal, 3)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	defer signal.Stop(sigs)
	a, err := start(o, s, raw, log)
	if err != nil {
		return err
	}
	return a.serve(sigs)
}

// check reports on a valid configuration; it binds nothing.
func check(s *settings, out io.Writer) error {
	if _, err := newCapacityServer(s); err != nil {
		return err
	}
	election := "none (always the master)"
	if e := s.file.Etcd; e != nil {
		election = fmt.Sprintf("etcd, %d endpoint(s), prefix %s, ttl %v", len(e.Endpoints), s.prefix(), s.ttl)
	}
	admin := s.file.Admin
	if admin == "" {
		admin = "off"
	}
	fmt.Fprintf(out, "configuration valid: %d resource template(s), listen %s, admin %s, election %s\n",
		len(s.resources.Resources), s.file.Listen, admin, election)
	return nil
}

// serve runs until SIGINT or SIGTERM, reloading on SIGHUP, then shuts
// the server down.
func (a *app) serve(sigs <-chan os.Signal) error {
	for sig := range sigs {
		if sig == syscall.SIGHUP {
			a.reload("SIGHUP")
			continue
		}
		a.log.Info("shutting down", "signal", sig.String())
		break
	}
	ctx, cancel := context.WithTimeout(context.Background(), a.opts.shutdownTimeout)
	defer cancel()
	a.shutdown(ctx)
	return nil
}
