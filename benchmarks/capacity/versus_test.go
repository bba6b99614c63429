package capacity

import (
	"bufio"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/throttlekit/throttle/internal/testproc"
)

var (
	rounds  = flag.Int("rounds", 5, "measuring rounds; each measures every server once")
	window  = flag.Duration("window", 5*time.Second, "how long each server is measured per round")
	clients = flag.Int("clients", 100, "concurrent clients of the load generator")
	// With both set, the load generator and the servers run on CPUs of
	// their own, so that neither takes the other's time.
	serverCPUs = flag.String("server-cpus", "", "CPU list (taskset -c) the servers run on; empty: any")
	genCPUs    = flag.String("loadgen-cpus", "", "CPU list (taskset -c) the load generators run on; empty: any")
)

// pinned returns a command that runs name with args on the CPUs cpus
// (through taskset, which execs it: the process keeps its pid), or
// exactly name with args when cpus is empty.
func pinned(cpus, name string, args ...string) *exec.Cmd {
	if cpus == "" {
		return exec.Command(name, args...)
	}
	return exec.Command("taskset", append([]string{"-c", cpus, name}, args...)...)
}

// The equivalent configurations: one resource of capacity 1000, FairShare,
// 2 s leases refreshed every second, learning for one lease.
const (
	resourceCapacity = 1000
	clientWants      = 15 // 100 clients want 1500: FairShare gives 10 each
	doormanConfig    = `resources:
  - identifier_glob: "*"
    capacity: 1000
    safe_capacity: 0
    description: benchmark
    algorithm:
      kind: FAIR_SHARE
      lease_length: 2
      refresh_interval: 1
      learning_mode_duration: 2
`
	capacitydConfig = `{"listen": "%s",%s "resources": [
  {"id": "*", "capacity": 1000, "algorithm": "fair_share", "lease_length": "2s", "refresh_interval": "1s"}
]}`
)

func TestMain(m *testing.M) {
	if os.Getenv(loadgenEnv) != "" {
		os.Exit(loadgenMain())
	}
	os.Exit(testproc.Main(m).Run())
}

// subject is a server under test and the load generator that calls it.
type subject struct {
	name    string
	server  *testproc.Proc
	pid     int
	gen     *exec.Cmd
	genIn   io.WriteCloser
	genOut  *bufio.Scanner
	results []result
}

// result is one measured window of one subject.
type result struct {
	calls   int64
	seconds float64
	cpu     time.Duration // the server's, user and system
	held    float64       // Σ of the clients' last grants
}

func (r result) callsPerSec() float64 { return float64(r.calls) / r.seconds }
func (r result) cpuPerCall() float64  { return float64(r.cpu.Microseconds()) / float64(r.calls) }
func (r result) nsPerCall() float64   { return r.seconds * 1e9 / float64(r.calls) }
func median(xs []float64) float64     { slices.Sort(xs); return (xs[(len(xs)-1)/2] + xs[len(xs)/2]) / 2 }
func each(rs []result, f func(result) float64) []float64 {
	out := make([]float64, len(rs))
	for i, r := range rs {
		out[i] = f(r)
	}
	return out
}

// TestVersusDoorman measures capacityd and Doorman side by side; see the
// package doc.
func TestVersusDoorman(t *testing.T) {
	doorman := os.Getenv("THROTTLE_DOORMAN_SERVER")
	if doorman == "" {
		testproc.Unavailable(t, "THROTTLE_REQUIRE_DOORMAN", "THROTTLE_DOORMAN_SERVER does not name a Doorman server binary")
	}
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		t.Skip("needs /proc to read the servers' CPU time")
	}
	dir := t.TempDir()
	capacityd := os.Getenv("THROTTLE_CAPACITYD_SERVER")
	if capacityd == "" {
		capacityd = filepath.Join(dir, "capacityd")
		build := exec.Command("go", "build", "-o", capacityd, ".")
		build.Dir = filepath.Join("..", "..", "cmd", "capacityd")
		if out, err := build.CombinedOutput(); err != nil {
			t.Fatalf("go build capacityd: %v\n%s", err, out)
		}
	}
	subjects := append([]*subject{startDoorman(t, doorman, dir)}, startCapacityd(t, "capacityd", capacityd, dir)...)
	if base := os.Getenv("THROTTLE_CAPACITYD_BASELINE"); base != "" {
		subjects = append(subjects, startCapacityd(t, "capacityd-baseline", base, dir)...)
	}
	// Warm up (and let learning end) before measuring.
	for _, s := range subjects {
		s.run(t, 3*time.Second)
	}
	for round := range *rounds {
		order := slices.Clone(subjects)
		if round%2 == 1 {
			slices.Reverse(order)
		}
		for _, s := range order {
			r := s.run(t, *window)
			s.results = append(s.results, r)
			// The benchmark format, for benchstat.
			fmt.Printf("BenchmarkGetCapacity/server=%s \t%d\t%.0f ns/op\t%.0f calls/s\t%.2f cpu-µs/call\n",
				s.name, r.calls, r.nsPerCall(), r.callsPerSec(), r.cpuPerCall())
		}
	}
	ref := subjects[0]
	refRate, refCPU := median(each(ref.results, result.callsPerSec)), median(each(ref.results, result.cpuPerCall))
	t.Logf("medians of %d rounds of %v, %d clients:", *rounds, *window, *clients)
	for _, s := range subjects {
		rate, cpu := median(each(s.results, result.callsPerSec)), median(each(s.results, result.cpuPerCall))
		t.Logf("  %-19s %8.0f calls/s (%.2fx)  %6.2f µs CPU/call (%.2fx)  Σ last grants %g of %d",
			s.name, rate, rate/refRate, cpu, cpu/refCPU, s.results[len(s.results)-1].held, resourceCapacity)
	}
}

func startDoorman(t *testing.T, bin, dir string) *subject {
	ports, err := testproc.FreePorts(2)
	if err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(dir, "doorman.yml")
	logs := filepath.Join(dir, "doorman-logs")
	if err := os.WriteFile(cfg, []byte(doormanConfig), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(logs, 0o700); err != nil {
		t.Fatal(err)
	}
	cmd := pinned(*serverCPUs, bin, "-port", strconv.Itoa(ports[0]), "-debug_port", strconv.Itoa(ports[1]),
		"-hostname", "127.0.0.1", "-config", "file:"+cfg, "-doorman_minimum_refresh_interval", "1s",
		"-log_dir", logs)
	cmd.Env = append(os.Environ(), "TMPDIR="+logs)
	return start(t, "doorman", cmd, fmt.Sprintf("127.0.0.1:%d", ports[0]))
}

// startCapacityd runs capacityd, and returns a subject for its
// grpc_listen port (gRPC with grpc-go's transport; a version without it
// has none) and one, name+"-listen", for its listen port (gRPC through
// net/http and connect-go).
func startCapacityd(t *testing.T, name, bin, dir string) []*subject {
	ports, err := testproc.FreePorts(2)
	if err != nil {
		t.Fatal(err)
	}
	addr, grpcAddr := fmt.Sprintf("127.0.0.1:%d", ports[0]), fmt.Sprintf("127.0.0.1:%d", ports[1])
	cfg := filepath.Join(dir, name+".json")
	write := func(extra string) {
		if err := os.WriteFile(cfg, []byte(fmt.Sprintf(capacitydConfig, addr, extra)), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(fmt.Sprintf(` "grpc_listen": %q,`, grpcAddr))
	if exec.Command(bin, "-check", "-config", cfg).Run() != nil {
		write("") // a version without grpc_listen
		grpcAddr = ""
	}
	cmd := pinned(*serverCPUs, bin, "-config", cfg, "-log-level", "warn", "-watch", "0")
	listen := start(t, "capacityd", cmd, addr)
	listen.name = name + "-listen"
	if grpcAddr == "" {
		return []*subject{listen}
	}
	g := attach(t, "capacityd", listen.server, listen.pid, grpcAddr)
	g.name = name
	return []*subject{g, listen}
}

// start runs a server and its load generator.
func start(t *testing.T, kind string, cmd *exec.Cmd, addr string) *subject {
	t.Helper()
	p, err := testproc.Start(cmd, 30*time.Second, testproc.Dials("tcp", addr))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Kill)
	return attach(t, kind, p, cmd.Process.Pid, addr)
}

// attach starts a load generator for the server p (process pid) at addr,
// and waits until every client has been answered once.
func attach(t *testing.T, kind string, p *testproc.Proc, pid int, addr string) *subject {
	t.Helper()
	s := &subject{name: kind, server: p, pid: pid}
	gen := pinned(*genCPUs, os.Args[0], "-test.run", "^$")
	gen.Env = append(os.Environ(), loadgenEnv+"=1", "LOADGEN_ADDR="+addr, "LOADGEN_WIRE="+kind,
		"LOADGEN_CLIENTS="+strconv.Itoa(*clients), "LOADGEN_WANTS="+strconv.Itoa(clientWants))
	gen.Stderr = os.Stderr
	var err error
	if s.genIn, err = gen.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	out, err := gen.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := gen.Start(); err != nil {
		t.Fatal(err)
	}
	s.gen, s.genOut = gen, bufio.NewScanner(out)
	t.Cleanup(func() { s.genIn.Close(); _ = gen.Wait() })
	if line := s.reply(t); line != "ready" {
		t.Fatalf("%s load generator: %q; server output:\n%s", kind, line, p.Output())
	}
	return s
}

func (s *subject) reply(t *testing.T) string {
	t.Helper()
	if !s.genOut.Scan() {
		t.Fatalf("%s load generator exited: %v; server output:\n%s", s.name, s.genOut.Err(), s.server.Output())
	}
	return s.genOut.Text()
}

// run has the load generator call the server for d, and returns what it
// measured.
func (s *subject) run(t *testing.T, d time.Duration) result {
	t.Helper()
	cpu0 := cpuTime(t, s.pid)
	fmt.Fprintf(s.genIn, "run %d\n", d)
	line := s.reply(t)
	cpu1 := cpuTime(t, s.pid)
	var r result
	var errs int64
	var first string
	if _, err := fmt.Sscanf(line, "%d %g %g %d", &r.calls, &r.seconds, &r.held, &errs); err != nil {
		t.Fatalf("%s load generator: %q: %v", s.name, line, err)
	}
	if errs > 0 {
		_, first, _ = strings.Cut(line, " err ")
		t.Fatalf("%s: %d of %d calls failed, first: %s", s.name, errs, r.calls+errs, first)
	}
	r.cpu = cpu1 - cpu0
	return r
}

// cpuTime returns the user and system time of process pid.
func cpuTime(t *testing.T, pid int) time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	// The fields after the command (which may hold spaces), from the
	// third: utime and stime are the 14th and 15th, in clock ticks
	// (USER_HZ, 100 on Linux).
	_, rest, _ := strings.Cut(string(b), ") ")
	f := strings.Fields(rest)
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		t.Fatalf("/proc/%d/stat: %q", pid, b)
	}
	return time.Duration(utime+stime) * (time.Second / 100)
}
