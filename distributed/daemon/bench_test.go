package daemon_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/throttlekit/throttle/distributed/daemon"
	"github.com/throttlekit/throttle/internal/testproc"
)

// BenchmarkLoopback measures decisions per second over loopback TCP with
// 1 to 64 connections, one query at a time per connection (unpipelined)
// and in batches of 64 (pipelined). It reports the p99 latency of a
// round trip (a query, or a batch when pipelined).
//
//	go test ./distributed/daemon -run XXX -bench Loopback -benchtime 3s
func BenchmarkLoopback(b *testing.B) {
	addr := fastDaemon(b)
	for _, batch := range []int{1, 64} {
		for _, conns := range []int{1, 4, 16, 64} {
			b.Run(fmt.Sprintf("pipeline=%d/conns=%d", batch, conns), func(b *testing.B) { load(b, addr, conns, batch) })
		}
	}
}

// BenchmarkLoopbackSeparate is BenchmarkLoopback's unpipelined closed loop
// with the daemon in a child process (this test binary again), so that the
// load generator does not share the Go scheduler with the server: what a
// client on the same host sees. It runs twice: "shared", both processes
// free to use every CPU, and "split", the daemon given half of them
// (GOMAXPROCS) and the load generator the rest. On 2 CPUs the shared run's
// tail is the kernel time-slicing four busy threads on two cores, not the
// daemon: split, the p99 at 64 connections falls by half.
//
//	go test ./distributed/daemon -run XXX -bench LoopbackSeparate -benchtime 3s
func BenchmarkLoopbackSeparate(b *testing.B) {
	n := runtime.NumCPU()
	for _, mode := range []struct {
		name           string
		server, client int
	}{{"shared", n, n}, {"split", max(n/2, 1), max(n-n/2, 1)}} {
		b.Run(mode.name, func(b *testing.B) {
			addr, stop := serveChild(b, mode.server)
			defer stop()
			for _, conns := range []int{1, 16, 64} {
				b.Run(fmt.Sprintf("conns=%d", conns), func(b *testing.B) {
					// Here, not around b.Run: testing sets GOMAXPROCS
					// for every benchmark it runs.
					defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(mode.client))
					load(b, addr, conns, 1)
				})
			}
		})
	}
}

// serveChild starts a daemon in a child process limited to procs
// threads running Go code, and returns its address and a function that
// stops it.
func serveChild(b *testing.B, procs int) (addr string, stop func()) {
	cmd := testproc.Self([]string{serveEnv + "=1", fmt.Sprintf("GOMAXPROCS=%d", procs)}, "-test.run=^$")
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	stop = func() {
		stdin.Close()
		cmd.Wait()
	}
	if _, err := fmt.Fscanln(stdout, &addr); err != nil {
		stop()
		b.Fatalf("daemon process: %v", err)
	}
	return addr, stop
}

// serveEnv makes TestMain run a daemon for BenchmarkLoopbackSeparate
// instead of the tests: it prints its address and serves until its
// standard input closes.
const serveEnv = "THROTTLED_BENCH_SERVE"

func serveForBenchmark() {
	s, err := startFast()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Println(s.Addrs()[0].String())
	io.Copy(io.Discard, os.Stdin)
	s.Shutdown(context.Background())
}

// load sends b.N queries over conns connections to addr, in batches of
// batch per round trip, each connection waiting for its replies before
// sending again (closed loop), and reports decisions per second and the
// p99 latency of a round trip.
func load(b *testing.B, addr string, conns, batch int) {
	cs := make([]net.Conn, conns)
	for i := range cs {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close()
		cs[i] = c
	}
	// Each connection sends its share of b.N queries.
	per := (b.N + conns*batch - 1) / (conns * batch)
	lat := make([][]time.Duration, conns)
	var wg sync.WaitGroup
	b.ResetTimer()
	start := time.Now()
	for i, c := range cs {
		wg.Go(func() {
			w := bufio.NewWriterSize(c, 64*16)
			r := bufio.NewReaderSize(c, 64*3)
			reply := make([]byte, 3*batch)
			var tags []string
			for j := range batch {
				tags = append(tags, "client-"+strconv.Itoa(i*batch+j)+"\n")
			}
			send := func() error {
				for _, t := range tags {
					w.WriteString(t)
				}
				return w.Flush()
			}
			lat[i] = roundTrips(b, per, nil, send, r, reply)
		})
	}
	wg.Wait()
	el := time.Since(start)
	b.StopTimer()
	all := sorted(lat)
	total := float64(per * conns * batch)
	b.ReportMetric(total/el.Seconds(), "decisions/s")
	if len(all) > 0 {
		b.ReportMetric(float64(all[len(all)*99/100].Microseconds()), "p99-µs")
	}
}

// startFast starts a daemon on a free loopback TCP port whose default
// limit (1000000/s, burst 1000000) admits every query of a benchmark.
func startFast() (*daemon.Server, error) {
	cfg := config("tcp:127.0.0.1:0")
	cfg.Default = daemon.Limit{Rate: "1000000/s", Burst: 1000000}
	s, err := daemon.New(cfg, nil)
	if err != nil {
		return nil, err
	}
	return s, s.Start()
}

// fastDaemon starts a daemon with startFast, shut down at the end of the
// benchmark, and returns its address.
func fastDaemon(b *testing.B) string {
	s, err := startFast()
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Shutdown(context.Background()) })
	return s.Addrs()[0].String()
}

// roundTrips makes n round trips and returns the time of each: pace(k)
// (when not nil) before the k-th, then send writes the query (or batch)
// and reply is read in full from r. On an error it reports it to b and
// returns nil.
func roundTrips(b *testing.B, n int, pace func(k int), send func() error, r io.Reader, reply []byte) []time.Duration {
	l := make([]time.Duration, 0, n)
	for k := range n {
		if pace != nil {
			pace(k)
		}
		t0 := time.Now()
		if err := send(); err != nil {
			b.Error(err)
			return nil
		}
		if _, err := io.ReadFull(r, reply); err != nil {
			b.Error(err)
			return nil
		}
		l = append(l, time.Since(t0))
	}
	return l
}

// sorted returns every connection's latencies in one sorted slice.
func sorted(lat [][]time.Duration) []time.Duration {
	all := slices.Concat(lat...)
	slices.Sort(all)
	return all
}

// BenchmarkLoopbackPaced offers a fixed load (open loop): 64 connections
// together send rate queries per second, one at a time each, and the p99
// latency of a query is reported. Unlike BenchmarkLoopback, where 64
// callers wait on each other and latency is mostly queueing, this shows the
// latency of a daemon that is not saturated.
//
//	go test ./distributed/daemon -run XXX -bench LoopbackPaced -benchtime 20000x
func BenchmarkLoopbackPaced(b *testing.B) {
	addr := fastDaemon(b)
	const conns = 64
	for _, rate := range []int{5000, 10000, 20000} {
		b.Run(fmt.Sprintf("conns=%d/rate=%d", conns, rate), func(b *testing.B) {
			per := max(b.N/conns, 1)
			period := time.Duration(conns) * time.Second / time.Duration(rate)
			lat := make([][]time.Duration, conns)
			var wg sync.WaitGroup
			start := time.Now()
			for i := range conns {
				c, err := net.Dial("tcp", addr)
				if err != nil {
					b.Fatal(err)
				}
				defer c.Close()
				wg.Go(func() {
					tag := []byte("client-" + strconv.Itoa(i) + "\n")
					reply := make([]byte, 3)
					offset := period * time.Duration(i) / conns
					pace := func(k int) {
						if d := time.Until(start.Add(offset + time.Duration(k)*period)); d > 0 {
							time.Sleep(d)
						}
					}
					send := func() error {
						_, err := c.Write(tag)
						return err
					}
					lat[i] = roundTrips(b, per, pace, send, c, reply)
				})
			}
			wg.Wait()
			all := sorted(lat)
			b.ReportMetric(float64(len(all))/time.Since(start).Seconds(), "decisions/s")
			b.ReportMetric(float64(all[len(all)/2].Microseconds()), "p50-µs")
			b.ReportMetric(float64(all[len(all)*99/100].Microseconds()), "p99-µs")
		})
	}
}
