package simbound

import (
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/throttlekit/throttle/internal/faultsim"
)

// Keys returns the keys a load shape asks over a run of length: five
// (and a hot one for HotKey), or one more each second for NewKeys.
func Keys(load faultsim.Load, length time.Duration) []string {
	var ks []string
	switch load {
	case faultsim.NewKeys:
		for i := range int(length/time.Second) + 3 {
			ks = append(ks, fmt.Sprintf("new-%d", i))
		}
	case faultsim.HotKey:
		ks = append(ks, "hot")
		fallthrough
	default:
		for i := range 5 {
			ks = append(ks, fmt.Sprintf("key-%d", i))
		}
	}
	return ks
}

// Pick returns the key a caller asks next at now and the caller's rate
// of asks (per second) by the load shape, for a caller that asks each
// key at perKey a second on average (0: the load is off).
func Pick(load faultsim.Load, keys []string, rng *rand.Rand, now time.Duration, perKey float64) (string, float64) {
	switch load {
	case faultsim.Bursty: // on 2 s at twice the rate, off 2 s
		if now/(2*time.Second)%2 == 1 {
			return "", 0
		}
		return keys[rng.IntN(len(keys))], 2 * perKey * float64(len(keys))
	case faultsim.NewKeys: // a new key every second, each asked for 3 s
		i := min(int(now/time.Second)+rng.IntN(3), len(keys)-1)
		return keys[i], 3 * perKey
	case faultsim.HotKey: // the hot key takes 70% of the asks, at about 3x
		if rng.IntN(10) < 7 {
			return keys[0], 2 * perKey * float64(len(keys))
		}
		return keys[1+rng.IntN(len(keys)-1)], 2 * perKey * float64(len(keys))
	}
	return keys[rng.IntN(len(keys))], perKey * float64(len(keys))
}

// Drive calls ask with the keys of the load shape, as one caller asking
// each key at perKey a second on average (Poisson arrivals), until stop
// is closed. elapsed reads the run's virtual time.
func Drive(stop <-chan struct{}, load faultsim.Load, keys []string, rng *rand.Rand, perKey float64,
	elapsed func() time.Duration, ask func(key string)) {
	for {
		now := elapsed()
		key, rate := Pick(load, keys, rng, now, perKey)
		gap := 2*time.Second - now%(2*time.Second) // the load is off
		if rate > 0 {
			gap = time.Duration(rng.ExpFloat64() / rate * float64(time.Second))
		}
		select {
		case <-stop:
			return
		case <-time.After(gap):
		}
		if rate > 0 {
			ask(key)
		}
	}
}
