package client_test

import (
	"bufio"
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/distributed/daemon"
	"github.com/throttlekit/throttle/distributed/daemon/client"
	"github.com/throttlekit/throttle/failsafe"
	"github.com/throttlekit/throttle/tokenbucket"
)

// fakeDaemon is an in-memory daemon for tests on virtual time: Dial
// fails while it is down, and otherwise returns one end of a pipe on
// which a goroutine answers every line "OK\n" after delay.
type fakeDaemon struct {
	down  atomic.Bool
	delay atomic.Int64
	dials atomic.Int64
	wg    sync.WaitGroup
}

func (f *fakeDaemon) dial(ctx context.Context, _, _ string) (net.Conn, error) {
	f.dials.Add(1)
	if f.down.Load() {
		return nil, errors.New("connection refused")
	}
	a, b := net.Pipe()
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		defer b.Close()
		r := bufio.NewReader(b)
		for {
			line, err := r.ReadString('\n')
			if err != nil {
				return
			}
			time.Sleep(time.Duration(f.delay.Load()))
			reply := "OK\n"
			if strings.HasPrefix(line, "bad") {
				reply = "ER\n"
			}
			if _, err := b.Write([]byte(reply)); err != nil {
				return
			}
		}
	}()
	return a, nil
}

// One caller's expired or cancelled context is that caller's failure:
// it neither puts the client in backoff nor makes other callers fail
// open.
func TestCallerContextIsNotAnOutage(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakeDaemon{}
		f.delay.Store(int64(5 * time.Millisecond))
		c, err := client.New("tcp", "daemon:1", client.WithDialer(f.dial), client.WithTimeout(time.Second), client.WithPolicy(failsafe.Closed))
		if err != nil {
			t.Fatal(err)
		}
		defer f.wg.Wait()
		defer c.Close()
		short, cancel := context.WithTimeout(context.Background(), time.Millisecond)
		defer cancel()
		ok, err := c.Check(short, "alice")
		if ok || !errors.Is(err, throttle.ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("expired context: %v, %v; want the fail-safe answer and an error wrapping ErrUnavailable and the context's error", ok, err)
		}
		gone, cancel2 := context.WithCancel(context.Background())
		cancel2()
		if _, err := c.Check(gone, "alice"); !errors.Is(err, context.Canceled) {
			t.Fatalf("cancelled context: %v", err)
		}
		for i := range 3 {
			if ok, err := c.Check(context.Background(), "bob"); !ok || err != nil {
				t.Fatalf("other caller, query %d: %v, %v; want a real answer", i, ok, err)
			}
		}
		if st := c.Stats(); st.Skipped != 0 || st.Failures != 0 {
			t.Fatalf("stats %+v: callers' contexts counted as daemon failures", st)
		}
	})
}

// After an outage the client answers for real again within its longest
// backoff (plus one timeout) of the daemon coming back, however long
// the outage lasted.
func TestRecoversSoonAfterOutage(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakeDaemon{}
		c, err := client.New("tcp", "daemon:1", client.WithDialer(f.dial))
		if err != nil {
			t.Fatal(err)
		}
		defer f.wg.Wait()
		defer c.Close()
		if ok, err := c.Check(context.Background(), "a"); !ok || err != nil {
			t.Fatal(ok, err)
		}
		c.Close() // drop the pooled connection: the daemon "restarts"
		c, _ = client.New("tcp", "daemon:1", client.WithDialer(f.dial))
		defer c.Close()
		f.down.Store(true)
		outage := time.Now().Add(60 * time.Second)
		for time.Now().Before(outage) {
			if ok, err := c.Check(context.Background(), "a"); !ok || !errors.Is(err, throttle.ErrUnavailable) {
				t.Fatalf("during the outage: %v, %v", ok, err)
			}
			time.Sleep(10 * time.Millisecond)
		}
		f.down.Store(false)
		back := time.Now()
		for {
			if _, err := c.Check(context.Background(), "a"); err == nil {
				break
			}
			if el := time.Since(back); el > time.Second+client.DefaultTimeout {
				t.Fatalf("still failing %v after the daemon came back", el)
			}
			time.Sleep(10 * time.Millisecond)
		}
		// While backing off, one caller at a time probes the daemon: a
		// 60 s outage polled every 10 ms dials far fewer times than it
		// queries.
		if d := f.dials.Load(); d > 200 {
			t.Fatalf("%d dials during the outage", d)
		}
	})
}

// A tag longer than the daemon accepts is refused before it is sent, and
// an "ER" reply is that query's error, not a daemon failure: other tags
// keep being limited.
func TestBadTagIsNotAnOutage(t *testing.T) {
	s := server(t, "tcp:127.0.0.1:0") // max_tag_len 256 (the default)
	addr := s.Addrs()[0].String()
	c := newClient(t, "tcp", addr, client.WithTimeout(5*time.Second))
	long := strings.Repeat("x", 300)
	if ok, err := c.Check(ctx, long); ok || !errors.Is(err, throttle.ErrInvalid) || errors.Is(err, throttle.ErrUnavailable) {
		t.Fatalf("300-byte tag: %v, %v; want refused with ErrInvalid", ok, err)
	}
	if _, err := c.Allow(ctx, long, 1); !errors.Is(err, throttle.ErrInvalid) {
		t.Fatalf("Allow(300-byte tag): %v", err)
	}
	for i, want := range []bool{true, true, true, false} {
		if ok, err := c.Check(ctx, "alice"); ok != want || err != nil {
			t.Fatalf("alice query %d after a long tag: %v, %v; want %v (limited, not failing open)", i, ok, err, want)
		}
	}
	// A daemon configured with a lower limit than the client: its ER is
	// a per-query error.
	cfg := daemon.Config{Listen: []string{"tcp:127.0.0.1:0"}, MaxTagLen: 8, Default: daemon.Limit{Rate: "1/m", Burst: 3}}
	s2, err := daemon.New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	s2.Start()
	defer s2.Shutdown(ctx)
	c2 := newClient(t, "tcp", s2.Addrs()[0].String(), client.WithTimeout(5*time.Second))
	for range 3 {
		if ok, err := c2.Check(ctx, "0123456789"); ok || !errors.Is(err, throttle.ErrInvalid) || errors.Is(err, throttle.ErrUnavailable) {
			t.Fatalf("tag the daemon rejects: %v, %v; want ErrInvalid", ok, err)
		}
	}
	out := make([]bool, 3)
	if err := c2.CheckMany(ctx, []string{"bob", "0123456789", "bob"}, out); !errors.Is(err, throttle.ErrInvalid) {
		t.Fatalf("CheckMany with one rejected tag: %v", err)
	}
	for i, want := range []bool{true, true, true, false} {
		if ok, err := c2.Check(ctx, "carol"); ok != want || err != nil {
			t.Fatalf("carol query %d: %v, %v; want %v", i, ok, err, want)
		}
	}
	if st := c2.Stats(); st.Failures != 0 || st.Skipped != 0 {
		t.Fatalf("stats %+v: ER counted as a failure", st)
	}
}

func TestMaxTagLenOption(t *testing.T) {
	for _, n := range []int{0, -1, client.HardMaxTagLen + 1} {
		if _, err := client.New("tcp", "x:1", client.WithMaxTagLen(n)); !errors.Is(err, throttle.ErrInvalid) {
			t.Errorf("WithMaxTagLen(%d): %v", n, err)
		}
	}
}

// A slow reply is not an outage: the query that timed out fails alone,
// and the next callers are answered by the daemon, not skipped and
// failed open. Only the consecutive failures WithBackoff sets start a backoff.
// (One reply over the timeout made every caller fail open for 100 ms.)
func TestSlowReplyIsNotAnOutage(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakeDaemon{}
		c, err := client.New("tcp", "daemon:1", client.WithDialer(f.dial), client.WithTimeout(25*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		defer f.wg.Wait()
		defer c.Close()
		f.delay.Store(int64(50 * time.Millisecond))
		if _, err := c.Check(context.Background(), "a"); !errors.Is(err, throttle.ErrUnavailable) {
			t.Fatalf("slow reply: %v, want ErrUnavailable", err)
		}
		f.delay.Store(0)
		for i := range 10 {
			if ok, err := c.Check(context.Background(), "a"); !ok || err != nil {
				t.Fatalf("query %d after one slow reply: %v, %v; want the daemon's answer", i, ok, err)
			}
		}
		// DefaultFailures consecutive failures start the backoff.
		f.down.Store(true)
		c.Close()
		c, _ = client.New("tcp", "daemon:1", client.WithDialer(f.dial), client.WithTimeout(25*time.Millisecond))
		defer c.Close()
		for range client.DefaultFailures {
			c.Check(context.Background(), "a")
		}
		before := f.dials.Load()
		if _, err := c.Check(context.Background(), "a"); !errors.Is(err, throttle.ErrUnavailable) || f.dials.Load() != before {
			t.Fatalf("after %d consecutive failures: %v, %d dials; want skipped", client.DefaultFailures, err, f.dials.Load()-before)
		}
		if st := c.Stats(); st.Skipped != 1 || st.Failures != client.DefaultFailures {
			t.Fatalf("stats %+v", st)
		}
	})
}

// WithFallback answers failed queries with a local limiter.
func TestFallbackPolicy(t *testing.T) {
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := ln.Addr().String()
	ln.Close()
	local, err := tokenbucket.New(throttle.NewRate(1, time.Hour), 2)
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.New("tcp", addr, client.WithFallback(local))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for i, want := range []bool{true, true, false} {
		d, err := c.Allow(context.Background(), "k", 1)
		if err != nil || d.Allowed != want {
			t.Fatalf("query %d with the daemon down: %+v, %v; want the fallback's %v", i, d, err, want)
		}
	}
	if _, err := client.New("tcp", addr, client.WithPolicy(failsafe.Fallback)); !errors.Is(err, throttle.ErrInvalid) {
		t.Fatalf("Fallback without a limiter: %v", err)
	}
}
