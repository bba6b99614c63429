package redislimit

import (
	"context"
	"testing"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/internal/redistest"
	"github.com/throttlekit/throttle/throttletest"
)

// TestPersistenceAcrossRestart measures what a restart of Redis forgets
// under each persistence setting: a fixed window of 200 per hour, with
// time standing still, is asked a burst of 200 (all admitted), Redis is
// stopped (killed with SIGKILL, a crash of the process; or SHUTDOWN, a
// clean stop) and started again on its data, and the burst is asked
// again: exactly 200 admitted in all means nothing was forgotten, 400
// that every admission was. A crash of the machine (power, kernel) is
// not tested: there, AOF everysec loses up to a second of writes and only
// AOF always loses nothing (see docs/guide/redis.md).
func TestPersistenceAcrossRestart(t *testing.T) {
	const burst = 200
	for _, c := range []struct {
		name       string
		args       []string
		crash, off int // admitted in all across a crash and a clean stop; 0: measured only
	}{
		{"none", nil, 2 * burst, 2 * burst},
		{"rdb", []string{"--save", "60 1"}, 2 * burst, burst}, // no snapshot within 60 s of the burst
		{"aof-everysec", []string{"--appendonly", "yes", "--appendfsync", "everysec"}, burst, burst},
		{"aof-always", []string{"--appendonly", "yes", "--appendfsync", "always"}, burst, burst},
	} {
		for _, stop := range []string{"crash", "shutdown"} {
			t.Run(c.name+"/"+stop, func(t *testing.T) {
				srv := redistest.Start(t, c.args...)
				srv.NeedOwn(t)
				l, err := NewFixedWindow(newClient(t, srv), burst, time.Hour, WithOptions(throttle.WithClock(throttletest.NewClock())), WithTimeout(5*time.Second), WithBreaker(0, 0))
				if err != nil {
					t.Fatal(err)
				}
				admitted := askBurst(t, l, burst)
				if stop == "crash" {
					srv.Kill()
				} else {
					_, _ = redistest.Do(srv.Addr, 10*time.Second, "SHUTDOWN") // answers by closing the connection once saved
					srv.Kill()
				}
				srv.Restart(t)
				admitted += askBurst(t, l, burst)
				want := map[string]int{"crash": c.crash, "shutdown": c.off}[stop]
				t.Logf("persistence %s, %s: %d admitted in all on two bursts of %d across the restart", c.name, stop, admitted, burst)
				if want != 0 && admitted != want {
					t.Errorf("admitted %d in all, want %d", admitted, want)
				}
				if admitted < burst || admitted > 2*burst {
					t.Errorf("admitted %d in all, outside [%d, %d]", admitted, burst, 2*burst)
				}
			})
		}
	}
}

// askBurst asks l for n single units of one key and returns how many it
// admitted; the limiter is retried until Redis answers after a restart.
func askBurst(t *testing.T, l throttle.Limiter, n int) int {
	t.Helper()
	admitted := 0
	for range n {
		var d throttle.Decision
		var err error
		for try := 0; try < 100; try++ {
			if d, err = l.Allow(context.Background(), "k", 1); err == nil {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		if err != nil {
			t.Fatal(err)
		}
		if d.Allowed {
			admitted++
		}
	}
	return admitted
}
