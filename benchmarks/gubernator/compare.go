package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// options of the comparison.
type options struct {
	repo       string        // the repository's root, to build cmd/throttled
	rounds     int           // rounds of every cell, subjects alternating
	duration   time.Duration // of one speed cell
	conns      []int         // connection counts of the speed table
	batch      int           // decisions per round trip of the batched rows (0: none)
	pin        bool          // servers on CPU 0, the load generator on CPU 1
	accuracy   time.Duration // of one accuracy round (0: no accuracy test)
	offered    float64       // decisions/s offered to the 3-node cluster
	rate       int           // the global limit, per second (and its burst)
	interval   time.Duration // throttled's gossip interval (0: its default)
	gubSync    time.Duration // gubernator's GlobalSyncWait, for the record (its default)
	accConns   int           // connections of the accuracy load, spread over the nodes
	workDir    string
	selfBinary string
}

func parseOptions(args []string) (*options, error) {
	o := &options{gubSync: 100 * time.Millisecond}
	fs := flag.NewFlagSet("gubernator", flag.ContinueOnError)
	fs.StringVar(&o.repo, "repo", "../..", "the repository's root directory (to build cmd/throttled)")
	fs.IntVar(&o.rounds, "rounds", 5, "rounds; the subjects alternate within each")
	fs.DurationVar(&o.duration, "duration", 3*time.Second, "length of one speed measurement")
	conns := fs.String("conns", "1,16,64", "connection counts of the speed table")
	fs.IntVar(&o.batch, "batch", 32, "decisions per round trip in the batched rows (0: no batched rows)")
	fs.BoolVar(&o.pin, "pin", runtime.NumCPU() >= 2, "run the server on CPU 0 and the load generator on CPU 1 (taskset)")
	fs.DurationVar(&o.accuracy, "accuracy", 10*time.Second, "length of one round of the 3-node accuracy test (0: skip it)")
	fs.Float64Var(&o.offered, "offered", 1000, "accuracy: decisions per second offered to the cluster in all")
	fs.IntVar(&o.rate, "limit", 100, "accuracy: the global limit per second, and its burst")
	fs.DurationVar(&o.interval, "interval", 0, "accuracy: throttled's gossip interval (0: its default, 1s)")
	fs.IntVar(&o.accConns, "acc-conns", 6, "accuracy: connections, spread evenly over the 3 nodes")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	for _, f := range strings.Split(*conns, ",") {
		n, err := strconv.Atoi(f)
		if err != nil || n < 1 {
			return nil, fmt.Errorf("-conns %q: want positive integers", *conns)
		}
		o.conns = append(o.conns, n)
	}
	if o.rounds < 1 {
		return nil, errors.New("-rounds must be at least 1")
	}
	if o.pin {
		if _, err := exec.LookPath("taskset"); err != nil {
			o.pin = false
		}
	}
	return o, nil
}

// compareMain runs the comparison and writes its report to out.
func compareMain(args []string, out io.Writer) error {
	o, err := parseOptions(args)
	if err != nil {
		return err
	}
	if o.workDir, err = os.MkdirTemp("", "gubernator-compare-"); err != nil {
		return err
	}
	defer os.RemoveAll(o.workDir)
	if o.selfBinary, err = os.Executable(); err != nil {
		return err
	}
	throttled := filepath.Join(o.workDir, "throttled")
	// cmd/throttled is a module of its own: built in its directory, it
	// resolves the rest of the tree through its replace directives, with or
	// without the workspace.
	build := exec.Command("go", "build", "-o", throttled, ".")
	build.Dir, build.Stdout, build.Stderr = filepath.Join(o.repo, "cmd", "throttled"), os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		return fmt.Errorf("building cmd/throttled in %s: %w", o.repo, err)
	}
	load1, _ := os.ReadFile("/proc/loadavg")
	fmt.Fprintf(out, "# throttled beside gubernator v2.13.0\n\n%s, %s/%s, %d CPUs, %s; load average before: %s\n",
		time.Now().UTC().Format("2006-01-02 15:04 MST"), runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), runtime.Version(), strings.TrimSpace(string(load1)))
	fmt.Fprintf(out, "command: GOWORK=off go run . %s\n", strings.Join(args, " "))
	if err := speed(o, throttled, out); err != nil {
		return err
	}
	if o.accuracy > 0 {
		if err := accuracy(o, throttled, out); err != nil {
			return err
		}
	}
	load2, _ := os.ReadFile("/proc/loadavg")
	fmt.Fprintf(out, "\nload average after: %s\n", strings.TrimSpace(string(load2)))
	return nil
}

// proc is a server process: it runs until its standard input closes.
type proc struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	addr  string // where clients connect
}

func (p *proc) stop() {
	p.stdin.Close()
	p.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { p.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		p.cmd.Process.Kill()
		<-done
	}
}

// cpu returns the CPU time the process used so far (utime+stime of
// /proc/PID/stat), in seconds.
func (p *proc) cpu() (float64, error) { return procCPU(p.cmd.Process.Pid) }

func procCPU(pid int) (float64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The fields after the command name, which is in parentheses.
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f))
	}
	u, _ := strconv.ParseUint(f[11], 10, 64)
	s, _ := strconv.ParseUint(f[12], 10, 64)
	return float64(u+s) / clockTicks, nil
}

// clockTicks is USER_HZ, the unit of /proc/PID/stat's times: 100 on
// every Linux architecture Go supports.
const clockTicks = 100

// selfCPU returns this process's CPU time in seconds.
func selfCPU() float64 {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
}

// command returns cmd run on CPU cpu when pinning.
func (o *options) command(cpu int, name string, args ...string) *exec.Cmd {
	if o.pin && cpu >= 0 {
		return exec.Command("taskset", append([]string{"-c", strconv.Itoa(cpu), name}, args...)...)
	}
	return exec.Command(name, args...)
}

// startProc starts cmd and waits until ready reports success.
func startProc(cmd *exec.Cmd, addr string, ready func() error) (*proc, error) {
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &proc{cmd: cmd, stdin: stdin, addr: addr}
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := ready()
		if err == nil {
			return p, nil
		}
		if time.Now().After(deadline) {
			p.stop()
			return nil, fmt.Errorf("%s did not start: %w", cmd.Path, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func dialable(addr string) func() error {
	return func() error {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
		}
		return err
	}
}

// freeAddrs returns n loopback addresses whose ports were free a moment
// ago, for TCP (and UDP, for gossip).
func freeAddrs(n int) ([]string, error) {
	var out []string
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		defer l.Close()
		out = append(out, l.Addr().String())
	}
	return out, nil
}

// startThrottled starts a throttled node listening on addr with limit
// rate/s, burst rate, gossiping on gossip with peers when gossip != "".
func startThrottled(o *options, bin string, cpu int, addr string, rate int, gossip string, peers []string) (*proc, error) {
	cfg := map[string]any{
		"listen":  []string{"tcp:" + addr},
		"default": map[string]any{"rate": fmt.Sprintf("%d/s", rate), "burst": rate},
	}
	if gossip != "" {
		g := map[string]any{"listen": gossip, "peers": peers, "secret": "a gossip secret for the comparison only"}
		if o.interval > 0 {
			g["interval"] = o.interval.String()
		}
		cfg["gossip"] = g
	}
	b, _ := json.Marshal(cfg)
	path := filepath.Join(o.workDir, "throttled-"+strings.ReplaceAll(addr, ":", "-")+".json")
	if err := os.WriteFile(path, b, 0o600); err != nil {
		return nil, err
	}
	return startProc(o.command(cpu, bin, "-config", path, "-log-level", "warn"), addr, dialable(addr))
}

// startGubernator starts a gubernator node with gRPC on addr, whose
// peers are all (addr among them; nil: itself alone).
func startGubernator(o *options, cpu int, addr string, all []string) (*proc, error) {
	h, err := freeAddrs(1)
	if err != nil {
		return nil, err
	}
	args := []string{"node", "-grpc", addr, "-http", h[0]}
	if len(all) > 0 {
		args = append(args, "-peers", strings.Join(all, ","))
	}
	cmd := o.command(cpu, o.selfBinary, args...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	ready := make(chan error, 1)
	go func() {
		line, err := bufio.NewReader(stdout).ReadString('\n')
		if err == nil && line != "ready\n" {
			err = fmt.Errorf("said %q", line)
		}
		ready <- err
		io.Copy(io.Discard, stdout)
	}()
	var gotReady error = errors.New("not ready yet")
	return startProc(cmd, addr, func() error {
		select {
		case gotReady = <-ready:
		default:
		}
		return gotReady
	})
}

// runLoad runs the load generator with args against the servers, and
// measures their CPU time over its sending.
func runLoad(o *options, cpu int, servers []*proc, args ...string) (loadResult, float64, error) {
	var res loadResult
	cmd := o.command(cpu, o.selfBinary, append([]string{"load"}, args...)...)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return res, 0, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return res, 0, err
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return res, 0, err
	}
	defer cmd.Wait()
	defer stdin.Close()
	r := bufio.NewReader(stdout)
	if line, err := r.ReadString('\n'); err != nil || line != "ready\n" {
		return res, 0, fmt.Errorf("load generator %v: %q, %v", args, line, err)
	}
	cpu0, err := serversCPU(servers)
	if err != nil {
		return res, 0, err
	}
	io.WriteString(stdin, "go\n")
	if err := json.NewDecoder(r).Decode(&res); err != nil {
		return res, 0, fmt.Errorf("load generator %v: %w", args, err)
	}
	cpu1, err := serversCPU(servers)
	if err != nil {
		return res, 0, err
	}
	if res.Errors > 0 {
		return res, 0, fmt.Errorf("load generator %v: %d failed round trips", args, res.Errors)
	}
	return res, cpu1 - cpu0, nil
}

// serversCPU returns the CPU time, in seconds, the servers used so far.
func serversCPU(servers []*proc) (float64, error) {
	sum := 0.0
	for _, s := range servers {
		c, err := s.cpu()
		if err != nil {
			return 0, err
		}
		sum += c
	}
	return sum, nil
}

// median returns the median of xs and their range.
func median(xs []float64) (med, lo, hi float64) {
	s := slices.Clone(xs)
	slices.Sort(s)
	n := len(s)
	if n == 0 {
		return 0, 0, 0
	}
	med = s[n/2]
	if n%2 == 0 {
		med = (s[n/2-1] + s[n/2]) / 2
	}
	return med, s[0], s[n-1]
}
