package throttle

import "context"

// Restrict returns l with only the abilities of mask (bits: 1 Reserver,
// 2 Holder, 4 QuotaReporter, 8 QuotaAllower), to make limiters of every
// set of abilities in tests.
func Restrict(l Limiter, mask int) Limiter {
	b := &decorated{l: l, d: func(ctx context.Context, c call, next nextFunc) (result, error) { return next(ctx, c) }}
	b.next = b.invoke
	return withAbilities[mask](b)
}

// BookedReservation is a granted reservation whose Cancel calls cancel.
func BookedReservation(limit int, cancel func()) Reservation {
	return Reservation{OK: true, Limit: limit, b: &booking{cancel: cancel}}
}

// WithJitter sets Wait's random share of each back-off.
var WithJitter = withJitter
