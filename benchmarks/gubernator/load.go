package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	guber "github.com/gubernator-io/gubernator/v2"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// loadSpec is what the load generator does, from its flags.
type loadSpec struct {
	proto    string        // "throttled" or "gubernator"
	addrs    []string      // the nodes; connection i goes to addrs[i%len(addrs)]
	conns    int           // connections, each a closed loop
	batch    int           // decisions per round trip
	duration time.Duration // how long to send
	key      string        // "" : a key of its own per connection; else this key for all
	rate     float64       // > 0: pace the load to this many decisions/s in all
	// The limit, for gubernator (throttled's is in its configuration):
	// limit per period, burst, and whether it is GLOBAL.
	limit  int64
	period time.Duration
	burst  int64
	global bool
}

// loadResult is what the load generator reports, as JSON on its standard
// output.
type loadResult struct {
	Decisions int64   // answered
	Allowed   int64   // of which admitted
	Errors    int64   // failed round trips
	Seconds   float64 // from the first request sent to the last answer
	P50, P99  float64 // round-trip latency, microseconds
	CPU       float64 // the load generator's own CPU seconds
}

// loadMain connects, prints "ready", waits for a line on its standard
// input, sends for the duration, and prints its loadResult.
func loadMain(args []string) error {
	var s loadSpec
	fs := flag.NewFlagSet("load", flag.ContinueOnError)
	fs.StringVar(&s.proto, "proto", "", "throttled or gubernator")
	addrs := fs.String("addrs", "", "comma-separated node addresses (throttled: TCP; gubernator: gRPC)")
	fs.IntVar(&s.conns, "conns", 1, "connections, each a closed loop")
	fs.IntVar(&s.batch, "batch", 1, "decisions per round trip: lines pipelined in one write (throttled), requests in one GetRateLimits call (gubernator)")
	fs.DurationVar(&s.duration, "duration", 3*time.Second, "how long to send")
	fs.StringVar(&s.key, "key", "", "one key for every request (default: a key per connection)")
	fs.Float64Var(&s.rate, "rate", 0, "decisions per second in all, paced (0: as fast as each closed loop goes)")
	fs.Int64Var(&s.limit, "limit", 1_000_000_000, "gubernator: the limit per -period")
	fs.DurationVar(&s.period, "period", time.Second, "gubernator: the limit's period")
	fs.Int64Var(&s.burst, "burst", 1_000_000_000, "gubernator: the burst")
	fs.BoolVar(&s.global, "global", false, "gubernator: the GLOBAL behavior")
	if err := fs.Parse(args); err != nil {
		return err
	}
	s.addrs = strings.Split(*addrs, ",")
	if *addrs == "" || s.conns < 1 || s.batch < 1 {
		return errors.New("load: -addrs, -conns >= 1 and -batch >= 1 are required")
	}
	var dial func(i int) (roundTripper, error)
	switch s.proto {
	case "throttled":
		dial = s.dialThrottled
	case "gubernator":
		dial = s.dialGubernator
	default:
		return fmt.Errorf("load: unknown -proto %q", s.proto)
	}
	rts := make([]roundTripper, s.conns)
	for i := range rts {
		rt, err := dial(i)
		if err != nil {
			return err
		}
		defer rt.close()
		// One round trip before the start: the connection is up.
		if _, err := rt.roundTrip(); err != nil {
			return fmt.Errorf("load: warm-up on connection %d: %w", i, err)
		}
		rts[i] = rt
	}
	fmt.Println("ready")
	if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil {
		return err
	}
	res := s.run(rts)
	return json.NewEncoder(os.Stdout).Encode(res)
}

// roundTripper sends one batch and returns how many of its decisions
// admitted.
type roundTripper interface {
	roundTrip() (allowed int, err error)
	close()
}

// run sends on every connection for s.duration and gathers the results.
func (s *loadSpec) run(rts []roundTripper) loadResult {
	cpu0 := selfCPU()
	var (
		wg                      sync.WaitGroup
		decisions, allowed, bad atomic.Int64
		lats                    = make([][]time.Duration, len(rts))
	)
	start := time.Now()
	stop := start.Add(s.duration)
	var period time.Duration // between round trips of one connection
	if s.rate > 0 {
		period = time.Duration(float64(time.Second) * float64(len(rts)*s.batch) / s.rate)
	}
	for i, rt := range rts {
		wg.Go(func() {
			l := make([]time.Duration, 0, 1024)
			next := start.Add(period * time.Duration(i) / time.Duration(len(rts)))
			for {
				if period > 0 {
					if d := time.Until(next); d > 0 {
						time.Sleep(d)
					}
					next = next.Add(period)
				}
				t0 := time.Now()
				if !t0.Before(stop) {
					break
				}
				n, err := rt.roundTrip()
				l = append(l, time.Since(t0))
				if err != nil {
					bad.Add(1)
					continue
				}
				decisions.Add(int64(s.batch))
				allowed.Add(int64(n))
			}
			lats[i] = l
		})
	}
	wg.Wait()
	el := time.Since(start)
	all := slices.Concat(lats...)
	slices.Sort(all)
	pct := func(p int) float64 {
		if len(all) == 0 {
			return 0
		}
		return float64(all[(len(all)-1)*p/100]) / float64(time.Microsecond)
	}
	return loadResult{Decisions: decisions.Load(), Allowed: allowed.Load(), Errors: bad.Load(), Seconds: el.Seconds(),
		P50: pct(50), P99: pct(99), CPU: selfCPU() - cpu0}
}

// keyOf is the key connection i asks about.
func (s *loadSpec) keyOf(i int) string {
	if s.key != "" {
		return s.key
	}
	return "client-" + strconv.Itoa(i)
}

// throttledConn is one connection to throttled: a batch is that many
// lines in one write, and as many 3-byte replies.
type throttledConn struct {
	c     net.Conn
	r     *bufio.Reader
	lines []byte
	reply []byte
}

func (s *loadSpec) dialThrottled(i int) (roundTripper, error) {
	c, err := net.Dial("tcp", s.addrs[i%len(s.addrs)])
	if err != nil {
		return nil, err
	}
	t := &throttledConn{c: c, r: bufio.NewReaderSize(c, 4096), reply: make([]byte, 3*s.batch)}
	for range s.batch {
		t.lines = append(t.lines, s.keyOf(i)+"\n"...)
	}
	return t, nil
}

func (t *throttledConn) roundTrip() (int, error) {
	t.c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := t.c.Write(t.lines); err != nil {
		return 0, err
	}
	if _, err := io.ReadFull(t.r, t.reply); err != nil {
		return 0, err
	}
	ok := 0
	for j := 0; j < len(t.reply); j += 3 {
		switch string(t.reply[j : j+3]) {
		case "OK\n":
			ok++
		case "NO\n":
		default:
			return 0, fmt.Errorf("throttled replied %q", t.reply[j:j+3])
		}
	}
	return ok, nil
}

func (t *throttledConn) close() { t.c.Close() }

// gubernatorConn is one gRPC client connection (one HTTP/2 connection)
// to a gubernator node: a batch is one GetRateLimits call with that many
// requests.
type gubernatorConn struct {
	cc  *grpc.ClientConn
	v1  guber.V1Client
	req *guber.GetRateLimitsReq
}

func (s *loadSpec) dialGubernator(i int) (roundTripper, error) {
	cc, err := grpc.NewClient(s.addrs[i%len(s.addrs)], grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	g := &gubernatorConn{cc: cc, v1: guber.NewV1Client(cc), req: &guber.GetRateLimitsReq{}}
	behavior := guber.Behavior_BATCHING
	if s.global {
		behavior = guber.Behavior_GLOBAL
	}
	for range s.batch {
		g.req.Requests = append(g.req.Requests, &guber.RateLimitReq{
			Name: "bench", UniqueKey: s.keyOf(i), Hits: 1,
			Limit: s.limit, Burst: s.burst, Duration: s.period.Milliseconds(),
			Algorithm: guber.Algorithm_LEAKY_BUCKET, Behavior: behavior,
		})
	}
	return g, nil
}

func (g *gubernatorConn) roundTrip() (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := g.v1.GetRateLimits(ctx, g.req)
	if err != nil {
		return 0, err
	}
	if len(resp.Responses) != len(g.req.Requests) {
		return 0, fmt.Errorf("gubernator: %d responses to %d requests", len(resp.Responses), len(g.req.Requests))
	}
	ok := 0
	for _, r := range resp.Responses {
		if r.Error != "" {
			return 0, errors.New("gubernator: " + r.Error)
		}
		if r.Status == guber.Status_UNDER_LIMIT {
			ok++
		}
	}
	return ok, nil
}

func (g *gubernatorConn) close() { g.cc.Close() }
