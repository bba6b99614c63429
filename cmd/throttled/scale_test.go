package main

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/internal/testproc"
	"github.com/throttlekit/throttle/tokenbucket"
)

// loadGenEnv makes the test binary run the load generator of
// TestGossipScale (its settings, as JSON, are the variable's value).
const loadGenEnv = "THROTTLED_TEST_LOADGEN"

// scale is what TestGossipScale asks of the cluster: every key asked
// 3x its rate, each ask sent to one of the daemons at random.
type scale struct {
	Daemons  []string      // TCP addresses
	Keys     int           // active keys
	Rate     string        // per key, as in the configuration
	Burst    int           // per key
	Duration time.Duration // of the load
}

// loadResult is what the load generator saw.
type loadResult struct {
	Asked, Admitted int64
	Ideal           int64 // what one token bucket per key admits for the same asks
	Late            time.Duration
}

// TestGossipScale runs 3 throttled daemons gossiping over loopback UDP, as
// separate processes, and a load generator process that asks each of
// THROTTLE_GOSSIP_SCALE keys 3 times its rate (1 per minute, burst 2;
// THROTTLE_GOSSIP_SCALE_RATE changes it), spread over the daemons at
// random, for THROTTLE_GOSSIP_SCALE_DURATION (default 4m). It reports
// what the cluster admitted against what one bucket per key admits for
// the same asks, and each daemon's memory (RSS growth per key) and CPU
// (process CPU time over the second half of the run, in cores):
//
//	THROTTLE_GOSSIP_SCALE=1000000 go test ./cmd/throttled -run TestGossipScale -v -timeout 30m
//
// THROTTLE_GOSSIP_SCALE_PROFILE=dir writes a CPU profile of the first
// daemon, from 90 s after its start for 60 s, to dir/daemon0.pprof.
// THROTTLE_GOSSIP_SCALE_MAX sets the bound on admitted/ideal the test
// checks (default 1.05); THROTTLE_GOSSIP_SCALE_ROUTING=owner runs the
// daemons with gossip.routing "owner" instead of all-to-all counters.
func TestGossipScale(t *testing.T) {
	keys, _ := strconv.Atoi(os.Getenv("THROTTLE_GOSSIP_SCALE"))
	if keys <= 0 {
		t.Skip("THROTTLE_GOSSIP_SCALE=<keys> runs it")
	}
	sc := scale{Keys: keys, Rate: "1/1m", Burst: 2, Duration: 4 * time.Minute}
	if r := os.Getenv("THROTTLE_GOSSIP_SCALE_RATE"); r != "" {
		sc.Rate = r
	}
	if d, err := time.ParseDuration(os.Getenv("THROTTLE_GOSSIP_SCALE_DURATION")); err == nil {
		sc.Duration = d
	}
	bound := 1.05
	if b, err := strconv.ParseFloat(os.Getenv("THROTTLE_GOSSIP_SCALE_MAX"), 64); err == nil {
		bound = b
	}
	routing := cmp.Or(os.Getenv("THROTTLE_GOSSIP_SCALE_ROUTING"), "all")
	const n = 3
	ports, err := testproc.FreePorts(3 * n)
	if err != nil {
		t.Fatal(err)
	}
	var gossipAddrs, admins []string
	for i := range n {
		sc.Daemons = append(sc.Daemons, fmt.Sprintf("127.0.0.1:%d", ports[3*i]))
		gossipAddrs = append(gossipAddrs, fmt.Sprintf("127.0.0.1:%d", ports[3*i+1]))
		admins = append(admins, fmt.Sprintf("127.0.0.1:%d", ports[3*i+2]))
	}
	var procs []*testproc.Proc
	for i := range n {
		var peers []string
		for j, a := range gossipAddrs {
			if j != i {
				peers = append(peers, strconv.Quote(a))
			}
		}
		cfg := testproc.WriteFile(t, "c.json", fmt.Sprintf(`{"listen":["tcp:%s"],"default":{"rate":%q,"burst":%d},"max_keys":%d,"admin":%q,
			"gossip":{"listen":%q,"peers":[%s],"secret":"0123456789abcdef0123","routing":%q}}`,
			sc.Daemons[i], sc.Rate, sc.Burst, 2*keys, admins[i], gossipAddrs[i], strings.Join(peers, ","), routing))
		cmd := throttled("-config", cfg, "-log-level", "warn")
		if dir := os.Getenv("THROTTLE_GOSSIP_SCALE_PROFILE"); dir != "" && i == 0 {
			cmd.Env = append(cmd.Env, cpuProfileEnv+"="+filepath.Join(dir, "daemon0.pprof"))
		}
		addr := sc.Daemons[i]
		p, err := testproc.Start(cmd, 10*time.Second, testproc.Dials("tcp", addr))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(p.Kill)
		procs = append(procs, p)
	}
	rss0 := make([]int64, n)
	for i, p := range procs {
		rss0[i] = procStatus(t, p.Pid(), "VmRSS")
	}
	settings, _ := json.Marshal(sc)
	gen := testproc.Self([]string{loadGenEnv + "=" + string(settings)}, "-test.run", "^$")
	out := new(strings.Builder)
	gen.Stdout, gen.Stderr = out, out
	if err := gen.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- gen.Wait() }()
	// CPU over the second half: every key is known by then.
	time.Sleep(sc.Duration / 2)
	alive := func() {
		for i, p := range procs {
			select {
			case <-p.Exited():
				t.Fatalf("daemon %d exited; its output:\n%s", i, p.Output())
			default:
			}
		}
	}
	alive()
	cpu0 := make([]time.Duration, n)
	for i, p := range procs {
		cpu0[i] = procCPU(t, p.Pid())
	}
	start := time.Now()
	var genErr error
	select {
	case genErr = <-done:
	case <-time.After(sc.Duration + 5*time.Minute):
		gen.Process.Kill()
		t.Fatalf("the load generator did not finish; output:\n%s", out)
	}
	window := time.Since(start)
	alive()
	if genErr != nil {
		t.Fatalf("load generator: %v; output:\n%s", genErr, out)
	}
	for i, p := range procs {
		cpu := procCPU(t, p.Pid()) - cpu0[i]
		rss := procStatus(t, p.Pid(), "VmRSS")
		hwm := procStatus(t, p.Pid(), "VmHWM")
		t.Logf("daemon %d: CPU %.3f of a core over the last %v; RSS %d MB (%d B per key over the start's %d MB), peak %d MB",
			i, cpu.Seconds()/window.Seconds(), window.Round(time.Second), rss>>20, (rss-rss0[i])/int64(keys), rss0[i]>>20, hwm>>20)
		t.Logf("daemon %d: %s", i, gossipMetrics(admins[i]))
	}
	var res loadResult
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &res); err != nil {
		t.Fatalf("load generator output %q: %v", out, err)
	}
	ratio := float64(res.Admitted) / float64(res.Ideal)
	t.Logf("routing %q: %d keys, %s burst %d, each asked 3x its rate for %v: %d asks, %d admitted, one bucket per key admits %d: %.4f; load generator at most %v late",
		routing, keys, sc.Rate, sc.Burst, sc.Duration, res.Asked, res.Admitted, res.Ideal, ratio, res.Late.Round(time.Millisecond))
	if ratio > bound {
		t.Errorf("the cluster admitted %.4f of one bucket per key, want at most %.2f", ratio, bound)
	}
}

// cpuProfileEnv makes the daemon process write a CPU profile to the
// variable's value (see profileCPU).
const cpuProfileEnv = "THROTTLED_TEST_CPUPROFILE"

// profileCPU writes a CPU profile of the process from 90 s after its
// start for 60 s to path.
func profileCPU(path string) {
	time.Sleep(90 * time.Second)
	f, err := os.Create(path)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return
	}
	defer f.Close()
	if err := pprof.StartCPUProfile(f); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return
	}
	time.Sleep(time.Minute)
	pprof.StopCPUProfile()
}

// gossipMetrics returns the gossip counters of the daemon whose admin
// listener is at addr, on one line.
func gossipMetrics(addr string) string {
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "throttled_gossip_") || strings.HasPrefix(l, "throttled_decisions_total") {
			out = append(out, strings.TrimPrefix(l, "throttled_"))
		}
	}
	return strings.Join(out, "; ")
}

// readProc returns the file /proc/pid/name. It skips the test without
// /proc, and fails it if the process is gone (a daemon that died).
func readProc(t *testing.T, pid int, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/%s", pid, name))
	if err == nil {
		return b
	}
	if _, serr := os.Stat("/proc/self/stat"); serr != nil {
		t.Skipf("no /proc: %v", serr)
	}
	t.Fatalf("process %d is gone: %v", pid, err)
	return nil
}

// procStatus returns a memory field (in bytes) of /proc/pid/status.
func procStatus(t *testing.T, pid int, field string) int64 {
	t.Helper()
	b := readProc(t, pid, "status")
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, field+":"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
}

// procCPU returns the user and system CPU time of process pid.
func procCPU(t *testing.T, pid int) time.Duration {
	t.Helper()
	b := readProc(t, pid, "stat")
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	ut, _ := strconv.ParseInt(f[11], 10, 64) // fields 14 and 15 of the line
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * time.Second / 100 // USER_HZ
}

// loadGen is the load generator process: it asks each key 3 times its
// rate, in passes over the keys in a random order spread evenly over a
// pass, each ask pipelined to a random daemon, and prints a loadResult.
func loadGen(settings string) error {
	var sc scale
	if err := json.Unmarshal([]byte(settings), &sc); err != nil {
		return err
	}
	rate, err := throttle.ParseRate(sc.Rate)
	if err != nil {
		return err
	}
	ideal, err := tokenbucket.New(rate, sc.Burst, throttle.WithMaxKeys(2*sc.Keys))
	if err != nil {
		return err
	}
	const connsPer = 2
	type conn struct {
		c   net.Conn
		w   *bufio.Writer
		out chan int // asks in flight, in order (the number of replies to read)
	}
	var conns []*conn
	var admitted, answered atomic.Int64
	var readers sync.WaitGroup
	for _, a := range sc.Daemons {
		for range connsPer {
			c, err := net.Dial("tcp", a)
			if err != nil {
				return err
			}
			x := &conn{c: c, w: bufio.NewWriterSize(c, 64<<10), out: make(chan int, 1<<20)}
			conns = append(conns, x)
			readers.Add(1)
			go func() {
				defer readers.Done()
				r := bufio.NewReaderSize(c, 64<<10)
				for range x.out {
					line, err := r.ReadSlice('\n')
					if err != nil {
						return
					}
					if string(line) == "OK\n" {
						admitted.Add(1)
					}
					answered.Add(1)
				}
			}()
		}
	}
	keys := make([]string, sc.Keys)
	for i := range keys {
		keys[i] = "k" + strconv.Itoa(i)
	}
	// Each key 3 times its rate: a pass over every key takes a third of
	// the time one token takes to refill.
	pass := rate.Duration(1) / 3
	perSec := float64(sc.Keys) / pass.Seconds()
	rng := rand.New(rand.NewPCG(1, 2))
	order := rng.Perm(sc.Keys)
	start := time.Now()
	var asked, idealN int64
	var late time.Duration
	ctx := context.Background()
	next := start
	for {
		now := time.Now()
		el := now.Sub(start)
		if el >= sc.Duration {
			break
		}
		if now.After(next) {
			fmt.Fprintf(os.Stderr, "%v: asked %d, answered %d, at most %v late\n", el.Round(time.Second), asked, answered.Load(), late.Round(time.Millisecond))
			next = next.Add(30 * time.Second)
		}
		due := int64(el.Seconds() * perSec)
		if lag := time.Duration(float64(due-asked) / perSec * float64(time.Second)); lag > late {
			late = lag
		}
		for ; asked < due; asked++ {
			i := int(asked % int64(sc.Keys))
			if i == 0 {
				rng.Shuffle(len(order), func(a, b int) { order[a], order[b] = order[b], order[a] })
			}
			k := keys[order[i]]
			if d, _ := ideal.Allow(ctx, k, 1); d.Allowed {
				idealN++
			}
			x := conns[rng.IntN(len(conns))]
			x.w.WriteString(k)
			x.w.WriteByte('\n')
			x.out <- 1
		}
		for _, x := range conns {
			if x.w.Buffered() > 0 {
				if err := x.w.Flush(); err != nil {
					return err
				}
			}
		}
		time.Sleep(time.Millisecond)
	}
	for _, x := range conns {
		close(x.out)
		x.c.SetReadDeadline(time.Now().Add(time.Minute))
	}
	readers.Wait()
	if a := answered.Load(); a != asked {
		return fmt.Errorf("%d asks answered of %d", a, asked)
	}
	for _, x := range conns {
		x.c.Close()
	}
	b, _ := json.Marshal(loadResult{Asked: asked, Admitted: admitted.Load(), Ideal: idealN, Late: late})
	fmt.Println(string(b))
	return nil
}
