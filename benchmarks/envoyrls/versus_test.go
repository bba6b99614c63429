package envoyrls

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"math/rand/v2"
	"net/http"
	_ "net/http/pprof"
	"os"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/throttlekit/throttle/distributed/gossip"
	"github.com/throttlekit/throttle/extra/envoyrls"
	"github.com/throttlekit/throttle/internal/envoyreftest"
	"github.com/throttlekit/throttle/internal/gcfloor"
	"github.com/throttlekit/throttle/internal/redistest"
	"github.com/throttlekit/throttle/internal/testproc"
)

// envBench turns the measurement on; it takes about four minutes.
const envBench = "THROTTLE_ENVOY_RLS_BENCH"

// benchConfig has four rules no load of the measurement reaches, so that
// every decision is a full one (a charge and an answer).
const benchConfig = `
domain: bench
descriptors:
  - key: d0
    rate_limit: {unit: second, requests_per_unit: 1000000000}
  - key: d1
    rate_limit: {unit: minute, requests_per_unit: 1000000000}
  - key: d2
    rate_limit: {unit: hour, requests_per_unit: 1000000000}
  - key: d3
    rate_limit: {unit: day, requests_per_unit: 1000000000}
`

// envBaseline, when set, is the test binary of this benchmark built from
// an earlier commit: its server is measured too ("throttled before"), in
// the same rounds, for a paired comparison of two versions.
const envBaseline = "THROTTLE_ENVOY_RLS_BASELINE"

// envSubjects, when set, is a regular expression: only the subjects
// whose names it matches are measured (e.g. "Redis"), for a shorter run.
const envSubjects = "THROTTLE_ENVOY_RLS_SUBJECTS"

// With both set, the servers and Redis run on the CPUs -server-cpus
// lists and this test, the load generator, on -loadgen-cpus' (lists as
// taskset -c takes them), so that neither takes the other's time: on two
// cores, -server-cpus 1 -loadgen-cpus 0.
var (
	serverCPUs = flag.String("server-cpus", "", "CPU list (taskset -c) the servers and Redis run on; empty: any")
	genCPUs    = flag.String("loadgen-cpus", "", "CPU list (taskset -c) the load generator runs on; empty: any")
)

// pinSelf runs this process, the load generator, on cpus (and the
// servers it starts next, which inherit them), when pinning is on.
func pinSelf(t *testing.T, cpus string) {
	if *serverCPUs == "" || *genCPUs == "" {
		return
	}
	if err := testproc.Pin(cpus, os.Getpid()); err != nil {
		t.Fatal(err)
	}
}

// cellTime is how long each cell of the table is measured, after a
// warm-up of a tenth of it.
var cellTime = time.Second

// rounds is how many times each cell is measured; the median is kept.
var rounds = flag.Int("rounds", 3, "how many times each cell is measured (the table keeps the median)")

// median is the result of median throughput (with its own p99).
func median(rs []result) result {
	rs = slices.Clone(rs)
	slices.SortFunc(rs, func(a, b result) int { return a.decisions - b.decisions })
	return rs[len(rs)/2]
}

// result is one cell: requests answered, descriptors decided, latencies.
type result struct {
	requests, decisions            int
	p99                            time.Duration
	elapsed                        time.Duration
	serverCPU, redisCPU, clientCPU time.Duration // see measure
	redisReads, redisCmds          float64
	serverSyscalls                 float64 // reads and writes of the server processes
	serverRSS                      float64 // MB resident, at the end
}

func (r result) perSecond() float64 { return float64(r.decisions) / r.elapsed.Seconds() }

// request builds a request of n descriptors on key.
func request(n int, key string) *rlsv3.RateLimitRequest {
	r := &rlsv3.RateLimitRequest{Domain: "bench"}
	for i := range n {
		r.Descriptors = append(r.Descriptors, &rlv3.RateLimitDescriptor{
			Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "d" + strconv.Itoa(i), Value: key}}})
	}
	return r
}

// load runs streams concurrent callers on c for d, each asking about
// descriptors descriptors on the hot key or on one of keys keys.
func load(t *testing.T, c rlsv3.RateLimitServiceClient, streams, descriptors, keys int, d time.Duration) result {
	var wg sync.WaitGroup
	var mu sync.Mutex
	var lat []time.Duration
	res := result{}
	stop := time.Now().Add(d)
	for s := range streams {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(s), 1))
			var mine []time.Duration
			n := 0
			for time.Now().Before(stop) {
				key := "hot"
				if keys > 1 {
					key = "k" + strconv.Itoa(rng.IntN(keys))
				}
				start := time.Now()
				if _, err := c.ShouldRateLimit(context.Background(), request(descriptors, key)); err != nil {
					t.Error(err)
					return
				}
				mine = append(mine, time.Since(start))
				n++
			}
			mu.Lock()
			lat = append(lat, mine...)
			res.requests += n
			mu.Unlock()
		})
	}
	wg.Wait()
	res.elapsed = d
	res.decisions = res.requests * descriptors
	if len(lat) > 0 {
		slices.Sort(lat)
		res.p99 = lat[len(lat)*99/100]
	}
	return res
}

func dial(t *testing.T, addr string) rlsv3.RateLimitServiceClient {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	c := rlsv3.NewRateLimitServiceClient(conn)
	testproc.Eventually(t, 10*time.Second, func() bool {
		_, err := c.ShouldRateLimit(context.Background(), request(1, "warmup"))
		return err == nil
	})
	return c
}

// Environment of a child process serving this service (see TestMain).
const (
	envServe  = "ENVOYRLS_BENCH_SERVE"  // the ServerConfig, JSON
	envGossip = "ENVOYRLS_BENCH_GOSSIP" // the gossip listen address, then the peers, comma separated
	// envPprof, set by hand, is where a child serves net/http/pprof
	// (e.g. 127.0.0.1:6061): run one subject of this service to profile
	// it under the load.
	envPprof = "THROTTLE_ENVOY_RLS_PPROF"
)

func TestMain(m *testing.M) {
	if cfg := os.Getenv(envServe); cfg != "" {
		go gcfloor.Run(time.Second, nil) // as throttled serving the API
		if addr := os.Getenv(envPprof); addr != "" {
			runtime.SetBlockProfileRate(10_000)
			go http.ListenAndServe(addr, nil)
		}
		if err := serveChild(cfg, os.Getenv(envGossip)); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		return
	}
	os.Exit(m.Run())
}

// serveChild runs this service until killed: the measured server is a
// process of its own, as the reference is.
func serveChild(cfg, gossipAddrs string) error {
	c, err := envoyrls.DecodeServerConfig([]byte(cfg))
	if err != nil {
		return err
	}
	var node *gossip.Node
	if gossipAddrs != "" {
		addrs := strings.Split(gossipAddrs, ",")
		tr, err := gossip.ListenUDP(addrs[0])
		if err != nil {
			return err
		}
		node, err = gossip.NewNode(gossip.Config{Transport: tr, Secret: []byte("0123456789abcdef0123"), Peers: addrs[1:], SpendCap: true})
		if err != nil {
			return err
		}
		if err := node.Start(); err != nil {
			return err
		}
	}
	var fleet *envoyrls.Fleet
	if node != nil {
		fleet = envoyrls.NewFleet(node, envoyrls.FleetOptions{})
	}
	if _, err := envoyrls.Start(c, nil, fleet); err != nil {
		return err
	}
	select {}
}

// serve starts this service in a child process on a free loopback port
// with backend, and returns its gRPC address.
func serve(t *testing.T, bin, dir, backend, redisAddr, gossipAddrs string) (string, int) {
	ports, err := testproc.FreePorts(1)
	if err != nil {
		t.Fatal(err)
	}
	addr := "127.0.0.1:" + strconv.Itoa(ports[0])
	c := envoyrls.ServerConfig{GRPC: addr, Config: dir, Watch: "off", Backend: backend}
	if backend == "redis" {
		c.Redis = &envoyrls.RedisConfig{Addrs: []string{redisAddr}, Timeout: "5s"} // 1 s failed requests at load average 33
	}
	b, _ := json.Marshal(c)
	cmd := testproc.Self([]string{envServe + "=" + string(b), envGossip + "=" + gossipAddrs})
	cmd.Path, cmd.Args[0] = bin, bin
	p, err := testproc.Start(cmd, 20*time.Second, testproc.Dials("tcp", addr))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Kill)
	return addr, p.Pid()
}

// fleetOf starts n child processes gossiping with each other, and a
// client that spreads its calls over them.
func fleetOf(t *testing.T, n int, dir string) (*roundRobin, []int) {
	ports, err := testproc.FreePorts(n)
	if err != nil {
		t.Fatal(err)
	}
	var addrs []string
	for _, p := range ports {
		addrs = append(addrs, "127.0.0.1:"+strconv.Itoa(p))
	}
	rr := &roundRobin{}
	var pids []int
	for i := range addrs {
		order := append([]string{addrs[i]}, slices.Delete(slices.Clone(addrs), i, i+1)...)
		addr, pid := serve(t, os.Args[0], dir, "gossip", "", strings.Join(order, ","))
		rr.all = append(rr.all, dial(t, addr))
		pids = append(pids, pid)
	}
	return rr, pids
}

// roundRobin spreads the calls over several clients, as Envoy spreads
// them over the hosts of the rate-limit cluster.
type roundRobin struct {
	rlsv3.RateLimitServiceClient
	all  []rlsv3.RateLimitServiceClient
	next sync.Mutex
	i    int
}

func (r *roundRobin) ShouldRateLimit(ctx context.Context, in *rlsv3.RateLimitRequest, opts ...grpc.CallOption) (*rlsv3.RateLimitResponse, error) {
	r.next.Lock()
	c := r.all[r.i%len(r.all)]
	r.i++
	r.next.Unlock()
	return c.ShouldRateLimit(ctx, in, opts...)
}

// TestVersusReference measures the reference and this service on the same
// Redis, this service in process, and across 3 gossip nodes, on the same
// configuration and load. Run it by hand, on two cores with the servers
// on one and the load generator on the other:
//
//	THROTTLE_ENVOY_RLS_BENCH=1 THROTTLE_ENVOY_RLS_BIN=/path/to/ratelimit \
//		go test -run Versus -v -timeout 10m ./benchmarks/envoyrls -server-cpus 1 -loadgen-cpus 0
func TestVersusReference(t *testing.T) {
	if os.Getenv(envBench) != "1" {
		t.Skip("a measurement of about four minutes: set " + envBench + "=1 to run it")
	}
	pinSelf(t, *serverCPUs) // what starts now runs there
	srv := redistest.Start(t)
	dir := t.TempDir()
	if err := os.WriteFile(dir+"/bench.yaml", []byte(benchConfig), 0o644); err != nil {
		t.Fatal(err)
	}
	rc := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { rc.Close() })
	subjects := chosen([]lazySubject{
		{"envoyproxy/ratelimit, Redis", func() subject {
			addr, p := envoyreftest.StartProc(t, envoyreftest.Binary(t), benchConfig, srv.Addr)
			return subject{c: dial(t, addr), pids: []int{p.Pid()}}
		}},
		{"throttled, Redis", func() subject { return one(t, os.Args[0], dir, "redis", srv.Addr) }},
		{"throttled before, Redis", func() subject { return one(t, os.Getenv(envBaseline), dir, "redis", srv.Addr) }},
		{"throttled, in process", func() subject { return one(t, os.Args[0], dir, "memory", "") }},
		{"throttled, 3 gossip nodes", func() subject {
			rr, pids := fleetOf(t, 3, dir)
			return subject{c: rr, pids: pids}
		}},
	}, os.Getenv(envSubjects), os.Getenv(envBaseline) != "")
	pinSelf(t, *genCPUs)
	var table, costs strings.Builder
	header := fmt.Sprintf("| streams | descriptors | keys | %s |\n|---|---|---|%s\n", joinNames(subjects), strings.Repeat("---|", len(subjects)))
	table.WriteString(header)
	costs.WriteString(header)
	for _, streams := range []int{1, 16, 64} {
		for _, descriptors := range []int{1, 4} {
			for _, keys := range []int{1, 100_000} {
				cell := fmt.Sprintf("| %d | %d | %s |", streams, descriptors, map[bool]string{true: "hot", false: "100k"}[keys == 1])
				table.WriteString(cell)
				costs.WriteString(cell)
				runs := make([][]result, len(subjects))
				for range *rounds { // the subjects alternate, so that a change of the machine's load hits all
					for i, s := range subjects {
						rc.FlushAll(context.Background())
						load(t, s.c, streams, descriptors, keys, cellTime/10)
						r := measure(t, rc, s, func() result { return load(t, s.c, streams, descriptors, keys, cellTime) })
						runs[i] = append(runs[i], r)
						printRound(streams, descriptors, keys, s.name, r)
					}
				}
				for i, rs := range runs {
					r := median(rs)
					fmt.Fprintf(&table, " %.0f/s", r.perSecond())
					if i > 0 {
						fmt.Fprintf(&table, " (%.1f×)", r.perSecond()/median(runs[0]).perSecond())
					}
					fmt.Fprintf(&table, ", p99 %v |", r.p99.Round(10*time.Microsecond))
					costs.WriteString(costOf(rs))
				}
				table.WriteString("\n")
				costs.WriteString("\n")
			}
		}
	}
	t.Log("decisions (descriptors decided) per second, × the first column's, and p99 per request:\n" + table.String())
	t.Log("server CPU + Redis CPU (+ the load generator's CPU) per decision, Redis reads (round trips) and commands per request, the servers' read and write system calls per request, over the rounds:\n" + costs.String())
}

// measure runs run and adds to its result the CPU time s's processes
// and the Redis server of rc spent, and the Redis reads and commands.
func measure(t *testing.T, rc *redis.Client, s subject, run func() result) result {
	self := []int{os.Getpid()}
	cpu0, client0, info0, io0 := procCPU(t, s.pids), procCPU(t, self), redisStats(t, rc), procSyscalls(t, s.pids)
	r := run()
	cpu1, client1, info1, io1 := procCPU(t, s.pids), procCPU(t, self), redisStats(t, rc), procSyscalls(t, s.pids)
	r.serverCPU, r.clientCPU, r.serverSyscalls = cpu1-cpu0, client1-client0, io1-io0
	r.serverRSS = procRSS(t, s.pids)
	r.redisCPU = time.Duration((info1["used_cpu_user"] + info1["used_cpu_sys"] - info0["used_cpu_user"] - info0["used_cpu_sys"]) * float64(time.Second))
	r.redisReads = info1["total_reads_processed"] - info0["total_reads_processed"] - 2 // the two INFO
	r.redisCmds = info1["total_commands_processed"] - info0["total_commands_processed"] - 2
	return r
}

// printRound prints one round of one cell in the benchmark format, for
// benchstat (e.g. benchstat -col /server).
func printRound(streams, descriptors, keys int, name string, r result) {
	d := float64(max(r.decisions, 1))
	fmt.Printf("BenchmarkVersus/streams=%d/descriptors=%d/keys=%d/server=%s 1 %.0f decisions/s %.0f p99-µs %.2f server-µs/decision %.2f redis-µs/decision %.2f syscalls/request %.1f rss-MB\n",
		streams, descriptors, keys, strings.NewReplacer(", ", "-", " ", "_", "/", "_").Replace(name), r.perSecond(),
		float64(r.p99.Microseconds()), float64(r.serverCPU.Microseconds())/d, float64(r.redisCPU.Microseconds())/d,
		r.serverSyscalls/float64(max(r.requests, 1)), r.serverRSS)
}

// costOf is a cell of the cost table: CPU per decision, and Redis reads
// and commands per request, summed over rs.
func costOf(rs []result) string {
	var sum result
	for _, r := range rs {
		sum.requests += r.requests
		sum.decisions += r.decisions
		sum.serverCPU += r.serverCPU
		sum.redisCPU += r.redisCPU
		sum.clientCPU += r.clientCPU
		sum.redisReads += r.redisReads
		sum.redisCmds += r.redisCmds
		sum.serverSyscalls += r.serverSyscalls
	}
	d, q := float64(max(sum.decisions, 1)), float64(max(sum.requests, 1))
	return fmt.Sprintf(" %.1f + %.1f (+ %.1f) µs; %.2f reads, %.2f cmds; %.1f syscalls |", float64(sum.serverCPU.Microseconds())/d,
		float64(sum.redisCPU.Microseconds())/d, float64(sum.clientCPU.Microseconds())/d, sum.redisReads/q, sum.redisCmds/q, sum.serverSyscalls/q)
}

// procCPU is the CPU time (user and system) the processes pids spent.
func procCPU(t *testing.T, pids []int) time.Duration {
	var ticks int64
	for _, pid := range pids {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		if err != nil {
			t.Fatal(err)
		}
		_, rest, _ := strings.Cut(string(b), ") ")
		f := strings.Fields(rest) // from field 3: utime and stime are fields 14 and 15
		for _, s := range f[11:13] {
			n, _ := strconv.ParseInt(s, 10, 64)
			ticks += n
		}
	}
	return time.Duration(ticks) * (time.Second / 100) // USER_HZ
}

// procSyscalls is how many read and write system calls the processes
// pids made (syscr and syscw of /proc/<pid>/io: calls of the read and
// write families, sockets' included).
func procSyscalls(t *testing.T, pids []int) float64 {
	return procSum(t, pids, "io", "syscr", "syscw")
}

// procRSS is the resident memory of the processes pids, in MB (VmRSS).
func procRSS(t *testing.T, pids []int) float64 {
	return procSum(t, pids, "status", "VmRSS") / 1000
}

// procSum sums the fields keys of /proc/<pid>/<file> ("key: value"
// lines) over the processes pids.
func procSum(t *testing.T, pids []int, file string, keys ...string) float64 {
	var n float64
	for _, pid := range pids {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/" + file)
		if err != nil {
			t.Fatal(err)
		}
		for line := range strings.SplitSeq(string(b), "\n") {
			if k, v, _ := strings.Cut(line, ":"); slices.Contains(keys, k) {
				f, _ := strconv.ParseFloat(strings.Fields(v)[0], 64)
				n += f
			}
		}
	}
	return n
}

// redisStats are the numeric fields of rc's INFO cpu and stats.
func redisStats(t *testing.T, rc *redis.Client) map[string]float64 {
	info, err := rc.Info(context.Background(), "cpu", "stats").Result()
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]float64{}
	for line := range strings.SplitSeq(info, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if f, err := strconv.ParseFloat(v, 64); ok && err == nil {
			m[k] = f
		}
	}
	return m
}

// lazySubject is a service to measure, started by start.
type lazySubject struct {
	name  string
	start func() subject
}

// one is the subject of one child process of bin (this test binary, or
// an earlier build of it) serving with backend.
func one(t *testing.T, bin, dir, backend, redisAddr string) subject {
	addr, pid := serve(t, bin, dir, backend, redisAddr, "")
	return subject{c: dial(t, addr), pids: []int{pid}}
}

// chosen starts the subjects whose names match filter; "before" ones
// only with baseline.
func chosen(all []lazySubject, filter string, baseline bool) []subject {
	re := regexp.MustCompile(filter)
	var ss []subject
	for _, l := range all {
		if re.MatchString(l.name) && (baseline || !strings.Contains(l.name, " before")) {
			s := l.start()
			s.name = l.name
			ss = append(ss, s)
		}
	}
	return ss
}

// subject is a service measured, and its processes.
type subject struct {
	name string
	c    rlsv3.RateLimitServiceClient
	pids []int
}

func joinNames(ss []subject) string {
	var names []string
	for _, s := range ss {
		names = append(names, s.name)
	}
	return strings.Join(names, " | ")
}
