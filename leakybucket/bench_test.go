package leakybucket_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/throttlekit/throttle/internal/bridge"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/leakybucket"
)

// BenchmarkMeter measures the meter (the same code as the token bucket,
// see package tokenbucket for the comparison with x/time/rate): a bucket
// that always admits (one unit per ns drains faster than calls pour) and
// one that always overflows, single and keyed over 1000 keys.
func BenchmarkMeter(b *testing.B) {
	ctx := context.Background()
	for _, allowed := range []bool{true, false} {
		r, capacity := throttle.NewRate(int(bridge.MaxPerSecond), time.Second), 1<<30
		if !allowed {
			r, capacity = throttle.NewRate(1, time.Hour), 1
		}
		name := map[bool]string{true: "allowed", false: "denied"}[allowed]
		b.Run("Bucket/"+name, func(b *testing.B) {
			m, err := leakybucket.NewBucket(r, capacity)
			if err != nil {
				b.Fatal(err)
			}
			m.AllowN(1)
			b.ReportAllocs()
			for b.Loop() {
				if d, _ := m.AllowN(1); d.Allowed != allowed {
					b.Fatal("unexpected decision")
				}
			}
		})
		b.Run("Limiter/"+name, func(b *testing.B) {
			l, err := leakybucket.New(r, capacity)
			if err != nil {
				b.Fatal(err)
			}
			defer l.Close()
			keys := make([]string, 1000)
			for i := range keys {
				keys[i] = "k" + strconv.Itoa(i)
				l.Allow(ctx, keys[i], 1)
			}
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				if d, _ := l.Allow(ctx, keys[i], 1); d.Allowed != allowed {
					b.Fatal("unexpected decision")
				}
				if i++; i == len(keys) {
					i = 0
				}
			}
		})
	}
}
