package redislimit

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/internal/faultproxy"
	"github.com/throttlekit/throttle/internal/redistest"
	"github.com/throttlekit/throttle/throttletest"
)

// TestLostReplies: a bucket of 100 (refilling once an hour, time standing
// still) asked through a proxy that, for a while, lets requests reach
// Redis and swallows the replies: a lease refill or a reservation whose
// reply is lost took its units in Redis, and the caller, told the call
// failed (ErrUnavailable), never spends them. The clients see at most
// 100 admitted in all (none granted twice), and no fewer than 100 minus
// what the lost calls could have taken (a lease: maxBatch each; a
// reservation: its units).
func TestLostReplies(t *testing.T) {
	const burst, maxBatch = 100, 8
	srv := redistest.Start(t)
	for _, mode := range []string{"leasing", "reserve"} {
		t.Run(mode, func(t *testing.T) {
			p := faultproxy.New(t, srv.Addr)
			c := redis.NewClient(&redis.Options{Addr: p.Addr, ContextTimeoutEnabled: true, MaxRetries: -1})
			defer c.Close()
			opts := []Option{WithPrefix(uniquePrefix()), WithOptions(throttle.WithClock(throttletest.NewClock())),
				WithTimeout(200 * time.Millisecond), WithBreaker(0, 0)}
			if mode == "leasing" {
				opts = append(opts, WithLeasing(maxBatch, time.Hour))
			}
			l, err := NewTokenBucket(c, throttle.NewRate(1, time.Hour), burst, opts...)
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			admitted, lost := 0, 0
			ask := func() error {
				var ok bool
				var err error
				if mode == "leasing" {
					var d throttle.Decision
					d, err = l.Allow(context.Background(), "k", 1)
					ok = d.Allowed
				} else {
					var r throttle.Reservation
					r, err = l.Reserve(context.Background(), "k", 1, 0)
					ok = r.OK && r.Delay == 0
				}
				if err == nil && ok {
					admitted++
				}
				return err
			}
			for range 20 {
				if err := ask(); err != nil {
					t.Fatal(err)
				}
			}
			p.Set(faultproxy.DropAnswers)
			for range 40 {
				if err := ask(); err != nil {
					if !errors.Is(err, throttle.ErrUnavailable) {
						t.Fatalf("a call whose reply was lost: %v, want ErrUnavailable", err)
					}
					lost++
				}
				if lost == 3 {
					break
				}
			}
			p.Set(faultproxy.Pass)
			for range 3 * burst {
				if ask() != nil {
					time.Sleep(10 * time.Millisecond) // until the client reconnects
				}
			}
			least := burst - lost*maxBatch
			if mode == "reserve" {
				least = burst - lost
			}
			t.Logf("%s: %d admitted in all, %d calls lost their reply", mode, admitted, lost)
			if admitted > burst || admitted < least {
				t.Fatalf("admitted %d in all, want between %d and %d", admitted, least, burst)
			}
		})
	}
}
