package testproc

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestFreePorts(t *testing.T) {
	ports, err := FreePorts(3)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[int]bool{}
	for _, p := range ports {
		if p <= 0 || seen[p] {
			t.Fatalf("ports %v: not distinct positive ports", ports)
		}
		seen[p] = true
	}
	if p, err := FreePort(10000); err != nil || p+10000 > 65535 {
		t.Fatalf("FreePort(10000) = %d, %v", p, err)
	}
}

func TestStartSignalKill(t *testing.T) {
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Skip("no sh")
	}
	p, err := Start(exec.Command(sh, "-c", "echo started; exec sleep 30"), 5*time.Second, func() error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	if err := RetryFor(5*time.Second, func() error {
		if !strings.Contains(p.Output(), "started") {
			return errors.New("no output yet")
		}
		return nil
	}); err != nil {
		t.Fatalf("output %q: %v", p.Output(), err)
	}
	if err := p.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	if err := p.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	p.Kill() // also waits
	select {
	case <-p.Exited():
	default:
		t.Fatal("Exited not closed after Kill")
	}
}

// SignalAtStart passes a process that stops cleanly on the signal and
// reports one that the signal kills.
func TestSignalAtStart(t *testing.T) {
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Skip("no sh")
	}
	for _, c := range []struct {
		script, want string
	}{
		{`trap 'kill $!; echo stopped; exit 0' TERM; echo started; sleep 30 & wait`, ""},
		{`echo started; exec sleep 30`, "exit code -1 after terminated"},
	} {
		err := SignalAtStart(2, syscall.SIGTERM, "stopped", func() (*Proc, error) {
			p, err := Start(exec.Command(sh, "-c", c.script), 5*time.Second, func() error { return nil })
			if err != nil {
				return nil, err
			}
			return p, RetryFor(5*time.Second, func() error {
				if !strings.Contains(p.Output(), "started") {
					return errors.New("not started yet")
				}
				return nil
			})
		})
		if got := fmt.Sprint(err); c.want == "" && err != nil || c.want != "" && !strings.Contains(got, c.want) {
			t.Errorf("%s: %v, want %q", c.script, err, c.want)
		}
	}
}

func TestStartFails(t *testing.T) {
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Skip("no sh")
	}
	// Exits before it is ready: the error says so and carries the output.
	_, err = Start(exec.Command(sh, "-c", "echo boom; exit 3"), 5*time.Second,
		func() error { return errors.New("not yet") })
	if err == nil || !strings.Contains(err.Error(), "exited") || !strings.Contains(err.Error(), "boom") {
		t.Fatalf("err = %v", err)
	}
	// Never ready: killed after the timeout.
	_, err = Start(exec.Command(sh, "-c", "exec sleep 30"), 100*time.Millisecond,
		func() error { return errors.New("not yet") })
	if err == nil || !strings.Contains(err.Error(), "not ready") {
		t.Fatalf("err = %v", err)
	}
	if _, err := Start(exec.Command("/nonexistent/binary"), time.Second, func() error { return nil }); err == nil {
		t.Fatal("started a missing binary")
	}
}

// A Slot holds one process at a time: a second Start fails while it
// runs, Signal fails once it is killed, and it starts again after Kill.
func TestSlot(t *testing.T) {
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Skip("no sh")
	}
	var s Slot
	ready := func() error { return nil }
	for range 2 {
		if err := s.Start(exec.Command(sh, "-c", "exec sleep 30"), 5*time.Second, ready); err != nil {
			t.Fatal(err)
		}
		if err := s.Start(exec.Command(sh, "-c", "exec sleep 30"), 5*time.Second, ready); err == nil {
			t.Fatal("a second process started in a slot that holds one")
		}
		if err := s.Signal(syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
		s.Kill()
		if err := s.Signal(syscall.SIGCONT); err == nil {
			t.Fatal("signalled a killed process")
		}
		s.Kill() // nothing held: a no-op
	}
}

// Repeat calls f until stop, which waits for the goroutines; a goroutine
// whose f returns false ends on its own.
func TestRepeat(t *testing.T) {
	var calls, once atomic.Int64
	stop := Repeat(2, func() bool { calls.Add(1); return true })
	Eventually(t, 5*time.Second, func() bool { return calls.Load() > 100 })
	stop()
	n := calls.Load()
	stopped := Repeat(2, func() bool { once.Add(1); return false })
	time.Sleep(20 * time.Millisecond)
	if calls.Load() != n || once.Load() != 2 {
		t.Fatalf("%d calls after stop; %d calls of an f that returns false, want 2", calls.Load()-n, once.Load())
	}
	stop() // again: nothing
	stopped()
}

func TestRetry(t *testing.T) {
	n := 0
	if err := Retry(3, func() error { n++; return errors.New("no") }); err == nil || n != 3 {
		t.Fatalf("Retry: %v after %d tries", err, n)
	}
	n = 0
	if err := RetryFor(time.Second, func() error {
		n++
		if n < 2 {
			return errors.New("no")
		}
		return nil
	}); err != nil || n != 2 {
		t.Fatalf("RetryFor: %v after %d tries", err, n)
	}
}

// A test Unavailable skips is counted under its reason, which names the
// variable that would make it fail, so that Main can report it.
func TestUnavailableIsReported(t *testing.T) {
	skipped.Lock()
	saved, savedCount := skipped.reasons, skipped.count
	skipped.reasons, skipped.count = nil, nil
	skipped.Unlock()
	t.Cleanup(func() {
		skipped.Lock()
		skipped.reasons, skipped.count = saved, savedCount
		skipped.Unlock()
	})
	const env = "THROTTLE_REQUIRE_TESTPROC_SELFTEST"
	t.Setenv(env, "")
	for range 2 {
		t.Run("needs a server", func(t *testing.T) { Unavailable(t, env, "server unavailable: not installed") })
	}
	t.Run("needs another", func(t *testing.T) { Unavailable(t, env, "other unavailable") })
	got := skipLines()
	want := []string{
		"skipped 2 tests: server unavailable: not installed; " + env + "=1 makes this a failure",
		"skipped 1 test: other unavailable; " + env + "=1 makes this a failure",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("skip report\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// TestSampler: the sampler records the worst sum and how long, per step,
// it was above the bound.
func TestSampler(t *testing.T) {
	var v atomic.Int64
	s := Sample(time.Millisecond, 10, func() float64 { return float64(v.Load()) })
	s.Step("under")
	time.Sleep(20 * time.Millisecond)
	s.Step("over")
	v.Store(12)
	time.Sleep(20 * time.Millisecond)
	v.Store(0)
	worst, over := s.Stop()
	if worst != 12 || over["over"] == 0 || over["under"] != 0 {
		t.Fatalf("worst %v, over %v", worst, over)
	}
	if w, _ := s.Stop(); w != worst {
		t.Fatal("a second Stop changed the result")
	}
}

func TestPin(t *testing.T) {
	if _, err := exec.LookPath("taskset"); err != nil {
		t.Skip("no taskset")
	}
	p, err := Start(exec.Command("sleep", "30"), 5*time.Second, func() error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	defer p.Kill()
	if err := Pin("0", p.Pid()); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(p.Pid()) + "/status")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), "Cpus_allowed_list:\t0\n") {
		t.Fatalf("after Pin(\"0\"), /proc status:\n%s", b)
	}
	if err := Pin("no-such-cpu", p.Pid()); err == nil {
		t.Fatal("Pin with a bad CPU list succeeded")
	}
}
