package throttletest

import (
	"context"
	"strconv"

	"github.com/throttlekit/throttle"
)

// Readmissions measures the eviction bypass of a keyed limiter bounded by
// throttle.WithMaxKeys, with time standing still: in each of rounds rounds
// a key takes its whole limit, then others distinct keys each take their
// whole limit (evicting it), then the key asks for one more unit. It
// returns in how many rounds that unit was admitted: 0 for a limiter that
// never lets an evicted key back in fresh.
func Readmissions(l throttle.Limiter, limit, others, rounds int) int {
	ctx := context.Background()
	admitted := 0
	for r := range rounds {
		key := "victim-" + strconv.Itoa(r)
		l.Allow(ctx, key, limit)
		for i := range others {
			l.Allow(ctx, "churn-"+strconv.Itoa(r)+"-"+strconv.Itoa(i), limit)
		}
		if d, _ := l.Allow(ctx, key, 1); d.Allowed {
			admitted++
		}
	}
	return admitted
}

// FalseDenials floods l with keys distinct keys never seen before, each
// asking for n units, and returns how many of them were denied: keys held
// to a debt left by other keys that shared their table cells.
func FalseDenials(l throttle.Limiter, prefix string, n, keys int) int {
	ctx := context.Background()
	denied := 0
	for i := range keys {
		if d, _ := l.Allow(ctx, prefix+strconv.Itoa(i), n); !d.Allowed {
			denied++
		}
	}
	return denied
}
