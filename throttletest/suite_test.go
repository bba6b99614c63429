package throttletest_test

import (
	"context"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/internal/limiterkit"
	"github.com/throttlekit/throttle/internal/testproc"
	"github.com/throttlekit/throttle/throttletest"
)

// model is a plain, mutex-guarded token bucket: the reference the suite is
// checked against. flaw, when set, breaks it in one way.
type model struct {
	mu    sync.Mutex
	clk   *throttletest.Clock
	burst int
	every time.Duration
	tat   map[string]time.Time
	flaw  string
}

func (m *model) Allow(_ context.Context, key string, n int) (throttle.Decision, error) {
	if m.flaw != "no-validation" {
		if err := limiterkit.CheckN(n, m.burst); err != nil {
			return throttle.Decision{}, err
		}
		if key == "" || len(key) > limiterkit.DefaultMaxKeyLen {
			return throttle.Decision{}, throttle.ErrInvalid
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.clk.Now()
	tat := m.tat[key]
	if tat.Before(now) {
		tat = now
	}
	cost := time.Duration(n) * m.every
	tau := time.Duration(m.burst) * m.every
	if m.flaw == "over-admit" {
		tau += m.every
	}
	d := throttle.Decision{Limit: m.burst}
	if next := tat.Add(cost); next.Sub(now) <= tau {
		m.tat[key], tat = next, next
		d.Allowed = true
	} else {
		d.RetryAfter = next.Sub(now) - tau
		if m.flaw == "early-retry" {
			d.RetryAfter -= time.Millisecond
		}
	}
	d.Remaining = int((tau - tat.Sub(now)) / m.every)
	d.ResetAfter = tat.Sub(now)
	return d, nil
}

func suite(flaw string) throttletest.Suite {
	const burst, every = 5, 100 * time.Millisecond
	return throttletest.Suite{
		New: func(_ testing.TB, clk *throttletest.Clock) throttle.Limiter {
			return &model{clk: clk, burst: burst, every: every, tat: map[string]time.Time{}, flaw: flaw}
		},
		Limit: burst,
		Bound: func(d time.Duration) int64 { return burst + int64(d/every) },
	}
}

func TestModelPasses(t *testing.T) { throttletest.Run(t, suite("")) }

// TestFlawedModels runs the suite on broken limiters in a child process and
// expects each to fail, with the check that should catch it named.
func TestFlawedModels(t *testing.T) {
	if flaw := os.Getenv("THROTTLETEST_FLAW"); flaw != "" {
		throttletest.Run(t, suite(flaw))
		return
	}
	for flaw, check := range map[string]string{
		"over-admit":    "Decision",
		"early-retry":   "RetryAfterHonest",
		"no-validation": "BadInput",
	} {
		cmd := testproc.Self([]string{"THROTTLETEST_FLAW=" + flaw}, "-test.run=^TestFlawedModels$", "-test.v")
		out, err := cmd.CombinedOutput()
		if err == nil {
			t.Errorf("flaw %q: the suite passed", flaw)
			continue
		}
		if !strings.Contains(string(out), "--- FAIL: TestFlawedModels/"+check) {
			t.Errorf("flaw %q: want sub-test %s to fail; output:\n%s", flaw, check, out)
		}
	}
}
