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
		// A crash with everysec is measured only: while a background fsync
		// is slow, Redis postpones writing the log for up to 2 s and still
		// replies (399 of 400 seen on a loaded machine).
		{"aof-everysec", []string{"--appendonly", "yes", "--appendfsync", "everysec"}, 0, burst},
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

// TestLeasingAcrossRestart: a process leasing tokens of a bucket of 100
// (refilling once an hour, time standing still) keeps spending what it
// leased while Redis is down and restarted (with AOF always, so the
// server keeps what it granted): the clients see at most 100 admitted in
// all, no leased token granted twice. Tokens granted by a lease whose
// reply the kill lost are never spent (the bucket under-admits by them,
// at most the two batches of 16 a process holds): once Redis is back the
// clients see between 68 and 100 admitted.
func TestLeasingAcrossRestart(t *testing.T) {
	const burst = 100
	srv := redistest.Start(t, "--appendonly", "yes", "--appendfsync", "always")
	srv.NeedOwn(t)
	clk := throttletest.NewClock()
	l, err := NewTokenBucket(newClient(t, srv), throttle.NewRate(1, time.Hour), burst, WithOptions(throttle.WithClock(clk)),
		WithTimeout(time.Second), WithBreaker(0, 0), WithLeasing(16, time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	admitted := 0
	ask := func() error {
		d, err := l.Allow(context.Background(), "k", 1)
		if err == nil && d.Allowed {
			admitted++
		}
		return err
	}
	for range 30 {
		if err := ask(); err != nil {
			t.Fatal(err)
		}
	}
	srv.Kill()
	for range 40 { // spends what it leased, until a call needs Redis
		if ask() != nil {
			break
		}
	}
	if admitted > burst {
		t.Fatalf("admitted %d with Redis down, above the bucket's %d", admitted, burst)
	}
	srv.Restart(t)
	for range 3 * burst {
		if ask() != nil {
			time.Sleep(10 * time.Millisecond) // until the client reconnects
		}
	}
	t.Logf("admitted %d in all across the restart, of a bucket of %d", admitted, burst)
	if admitted > burst || admitted < burst-2*16 {
		t.Fatalf("admitted %d in all across the restart, want between %d and %d", admitted, burst-2*16, burst)
	}
}
