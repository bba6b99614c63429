package capacity

import (
	"context"
	"errors"
	"math"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/throttlekit/throttle"
)

// warmServer returns a server past its learning period, attached to a
// new memNetwork at "s1". Call inside a synctest bubble.
func warmServer(t *testing.T, capacity float64) (*Server, *memNetwork) {
	t.Helper()
	s, err := NewServer(testConfig(capacity), withSeed(3))
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Second)
	n := new(memNetwork)
	n.Attach("s1", s)
	return s, n
}

// newClient returns a client of the servers s1 and s2 on n with the id
// id, closed at the end of the test.
func newClient(t *testing.T, n Transport, id string, opts ...ClientOption) *Client {
	t.Helper()
	return dialClient(t, n, []string{"s1", "s2"}, append([]ClientOption{WithClientID(id)}, opts...)...)
}

// openResource opens the resource id on c, wanting wants.
func openResource(t *testing.T, c *Client, id string, wants float64, opts ...ResourceOption) *Resource {
	t.Helper()
	r, err := c.Resource(id, wants, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// dialClient returns a client of servers through tr, closed at the end of
// the test.
func dialClient(t *testing.T, tr Transport, servers []string, opts ...ClientOption) *Client {
	t.Helper()
	c, err := NewClient(tr, servers, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func TestClientSharesAndFollowsLease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, n := warmServer(t, 100)
		a, b := newClient(t, n, "a"), newClient(t, n, "b")
		ra, err := a.Rate("r", 100)
		if err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		if got := ra.Capacity(); got != 100 {
			t.Fatalf("a alone: %v", got)
		}
		if r := ra.b.Rate(); r != throttle.PerSecond(100) {
			t.Fatalf("bucket rate %v", r)
		}
		rb, err := b.Rate("r", 100)
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Second) // two refresh intervals
		if ca, cb := ra.Capacity(), rb.Capacity(); ca != 50 || cb != 50 {
			t.Fatalf("shares %v, %v, want 50, 50", ca, cb)
		}
		l, ok := ra.Lease()
		if !ok || l.Capacity != 50 || time.Until(l.Expiry) > 20*time.Second || l.Expiry.Before(time.Now()) {
			t.Fatalf("lease %+v %v", l, ok)
		}
		if err := rb.SetWants(10); err != nil {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Second)
		if ca, cb := ra.Capacity(), rb.Capacity(); ca != 90 || cb != 10 {
			t.Fatalf("after SetWants: %v, %v, want 90, 10", ca, cb)
		}
		for _, w := range []float64{math.NaN(), -1, math.Inf(1)} {
			if err := rb.SetWants(w); !errors.Is(err, throttle.ErrInvalid) {
				t.Fatalf("SetWants(%v): %v", w, err)
			}
		}
		if d, err := ra.Allow(context.Background(), "", 1); err != nil || !d.Allowed {
			t.Fatalf("Allow: %+v %v", d, err)
		}
		if err := rb.Close(); err != nil {
			t.Fatal(err)
		}
		if _, err := rb.Allow(context.Background(), "", 1); !errors.Is(err, throttle.ErrClosed) {
			t.Fatalf("Allow after Close: %v", err)
		}
		time.Sleep(6 * time.Second)
		if ca := ra.Capacity(); ca != 100 {
			t.Fatalf("after b closed: %v", ca)
		}
	})
}

func TestClientModes(t *testing.T) {
	for _, tc := range []struct {
		mode Mode
		want float64
	}{{Safe, 25}, {Optimistic, 50}, {Pessimistic, 0}} {
		synctest.Test(t, func(t *testing.T) {
			s, n := warmServer(t, 100)
			cfg := testConfig(100)
			cfg.Resources[0].SafeCapacity = 25
			if err := s.SetConfig(cfg); err != nil {
				t.Fatal(err)
			}
			a, b := newClient(t, n, "a", WithMode(tc.mode)), newClient(t, n, "b")
			ra, _ := a.Rate("r", 50)
			b.Rate("r", 50)
			time.Sleep(6 * time.Second)
			if got := ra.Capacity(); got != 50 {
				t.Fatalf("%v: capacity %v before the outage", tc.mode, got)
			}
			n.SetDown("s1", true)
			time.Sleep(15 * time.Second)
			if got := ra.Capacity(); got != 50 {
				t.Fatalf("%v: lease ended early: %v", tc.mode, got)
			}
			time.Sleep(6 * time.Second)
			if _, ok := ra.Lease(); ok {
				t.Fatalf("%v: lease did not expire", tc.mode)
			}
			if got := ra.Capacity(); got != tc.want {
				t.Fatalf("%v: capacity %v after expiry, want %v", tc.mode, got, tc.want)
			}
			n.SetDown("s1", false)
			time.Sleep(17 * time.Second) // retries back off up to 16s
			if got := ra.Capacity(); got != 50 {
				t.Fatalf("%v: capacity %v after recovery", tc.mode, got)
			}
			if err := a.Close(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestClientFollowsRedirect(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, n := warmServer(t, 100)
		follower, err := NewServer(testConfig(100))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		go follower.Run(ctx, fakeElection{ls: []Leadership{{Master: "s1", Term: 1}}}, "s2")
		synctest.Wait()
		n.Attach("s2", follower)
		c, err := NewClient(n, []string{"s2"}, WithClientID("a"))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		r, _ := c.Rate("r", 30)
		synctest.Wait()
		if got := r.Capacity(); got != 30 {
			t.Fatalf("capacity %v after redirect", got)
		}
		if st := s.Status(); st.Resources[0].Clients != 1 {
			t.Fatalf("master status %+v", st)
		}
	})
}

// leasedGauge is client a's gauge resource wanting wants of a server
// of capacity 100, once its first lease has come.
func leasedGauge(t *testing.T, wants float64) (*Client, *GaugeResource) {
	t.Helper()
	_, n := warmServer(t, 100)
	c := newClient(t, n, "a")
	r, err := c.Gauge("r", wants)
	if err != nil {
		t.Fatal(err)
	}
	synctest.Wait()
	return c, r
}

func TestChangesCoalesce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, r := leasedGauge(t, 40)
		defer c.Close()
		r.SetWants(30)
		time.Sleep(2 * time.Second)
		r.SetWants(20)
		time.Sleep(2 * time.Second)
		if got := <-r.Changes(); got != 20 {
			t.Fatalf("latest change %v, want 20", got)
		}
		select {
		case v := <-r.Changes():
			t.Fatalf("stale value %v queued", v)
		default:
		}
		if r.s.Limit() != 20 {
			t.Fatalf("semaphore limit %d", r.s.Limit())
		}
		d, release, err := throttle.TryHold(t.Context(), r, "", 20)
		if err != nil || !d.Allowed {
			t.Fatalf("20 of 20 not held: %+v, %v", d, err)
		}
		if d, _, _ := r.TryHold(t.Context(), "", 1); d.Allowed {
			t.Fatal("semaphore does not follow the lease")
		}
		release()
		if r.InFlight() != 0 {
			t.Fatalf("%d in flight after release", r.InFlight())
		}
	})
}

// TestGaugeHolds: a GaugeResource is a throttle.Holder. Hold takes the
// units its lease allows, TryHold denies past the lease, the release
// funcs give units back once, and after Close both fail with ErrClosed.
func TestGaugeHolds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, r := leasedGauge(t, 5)
		defer c.Close()
		var h throttle.Holder = r
		release, err := h.Hold(t.Context(), "", 5)
		if err != nil {
			t.Fatal(err)
		}
		if d, _, err := h.TryHold(t.Context(), "", 1); err != nil || d.Allowed {
			t.Fatalf("6th unit of a lease of 5: %+v, %v", d, err)
		}
		release()
		release()
		if r.InFlight() != 0 {
			t.Fatalf("%d in flight after release", r.InFlight())
		}
		d, release, err := h.TryHold(t.Context(), "", 5)
		if err != nil || !d.Allowed {
			t.Fatalf("5 of 5 after release: %+v, %v", d, err)
		}
		release()
		r.Close()
		if _, _, err := h.TryHold(t.Context(), "", 1); !errors.Is(err, throttle.ErrClosed) {
			t.Fatalf("TryHold after Close: %v", err)
		}
		if _, err := h.Hold(t.Context(), "", 1); !errors.Is(err, throttle.ErrClosed) {
			t.Fatalf("Hold after Close: %v", err)
		}
	})
}

// lyingTransport answers with grants no server should send.
type lyingTransport struct{ g Grant }

func (l lyingTransport) GetCapacity(_ context.Context, _ string, req *Request) (*Response, error) {
	g := l.g
	g.Resource = req.Resources[0].Resource
	return &Response{Grants: []Grant{g}}, nil
}

func (lyingTransport) Release(context.Context, string, *ReleaseRequest) (*Response, error) {
	return &Response{}, nil
}

func TestClientRefusesBadGrants(t *testing.T) {
	for _, g := range []Grant{
		{Capacity: math.NaN(), Lease: time.Minute, Refresh: time.Second},
		{Capacity: -5, Lease: time.Minute, Refresh: time.Second},
		{Capacity: math.Inf(1), Lease: time.Minute, Refresh: time.Second},
		{Capacity: 5, Lease: -time.Minute, Refresh: time.Second},
		{Capacity: 5, Lease: time.Minute, Refresh: 0},
		{Capacity: 5, Lease: time.Minute, Refresh: time.Second, SafeCapacity: math.NaN()},
		{Capacity: 5, Lease: 100 * 24 * time.Hour, Refresh: time.Second},
	} {
		synctest.Test(t, func(t *testing.T) {
			c := newClient(t, lyingTransport{g}, "a", WithMode(Pessimistic))
			r, _ := c.Rate("r", 10)
			time.Sleep(3 * time.Second)
			if _, ok := r.Lease(); ok || r.Capacity() != 0 {
				t.Fatalf("accepted %+v: capacity %v", g, r.Capacity())
			}
			if d, err := r.Allow(context.Background(), "", 1); err != nil || d.Allowed {
				t.Fatalf("zero capacity admitted: %+v %v", d, err)
			}
		})
	}
}

func TestClientBadArguments(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := new(memNetwork)
		if _, err := NewClient(nil, []string{"x"}); !errors.Is(err, throttle.ErrInvalid) {
			t.Error(err)
		}
		if _, err := NewClient(n, nil); !errors.Is(err, throttle.ErrInvalid) {
			t.Error(err)
		}
		if _, err := NewClient(n, []string{"x"}, WithMode(7)); !errors.Is(err, throttle.ErrInvalid) {
			t.Error(err)
		}
		c := newClient(t, n, "")
		if c.ID() == "" {
			t.Error("no generated id")
		}
		for _, f := range []func() error{
			func() error { _, err := c.Rate("", 1); return err },
			func() error { _, err := c.Rate("r", math.NaN()); return err },
			func() error { _, err := c.Gauge("r", 1, WithWeight(0)); return err },
			func() error { _, err := c.Resource("r", 1, WithSafeCapacity(-1)); return err },
		} {
			if err := f(); !errors.Is(err, throttle.ErrInvalid) {
				t.Errorf("err = %v, want ErrInvalid", err)
			}
		}
		if _, err := c.Resource("r", 1); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Resource("r", 1); !errors.Is(err, throttle.ErrInvalid) {
			t.Errorf("open twice: %v", err)
		}
		if err := c.Close(); !errors.Is(err, throttle.ErrUnavailable) {
			t.Errorf("Close with no server: %v", err)
		}
		if _, err := c.Resource("q", 1); !errors.Is(err, throttle.ErrClosed) {
			t.Errorf("after Close: %v", err)
		}
	})
}

func TestEstimatedWants(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, n := warmServer(t, 1000)
		c := newClient(t, n, "a")
		r, _ := c.Rate("r", 1, WithEstimatedWants())
		ctx, cancel := context.WithCancel(context.Background())
		go func() { // asks for 200 units per second
			tick := time.NewTicker(5 * time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-tick.C:
					r.Allow(ctx, "", 1)
				}
			}
		}()
		time.Sleep(40 * time.Second)
		cancel()
		if w := r.Wants(); w < 180 || w > 220 {
			t.Fatalf("estimated wants %v, want about 200", w)
		}
		if got := r.Capacity(); got < 150 {
			t.Fatalf("capacity %v did not follow the estimate", got)
		}
	})
}

// countingTransport fails every call and counts them.
type countingTransport struct{ calls atomic.Int64 }

func (c *countingTransport) GetCapacity(context.Context, string, *Request) (*Response, error) {
	c.calls.Add(1)
	return nil, throttle.ErrUnavailable
}

func (c *countingTransport) Release(context.Context, string, *ReleaseRequest) (*Response, error) {
	return nil, throttle.ErrUnavailable
}

func TestClientBacksOff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := new(countingTransport)
		c, err := NewClient(tr, []string{"s1"}, WithClientID("a"))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Rate("r", 1); err != nil {
			t.Fatal(err)
		}
		time.Sleep(5 * time.Minute)
		// 1+2+4+8+16 s, then every 16 s: about 22 refreshes of 3 calls
		// (three tries through the one address).
		if n := tr.calls.Load(); n > 3*25 {
			t.Fatalf("%d calls in 5 minutes with no server", n)
		}
		c.Close()
	})
}
