package storelimit

// Settle waits for the background refills of a leasing Limiter.
func Settle(l *Limiter) {
	if l.lease != nil {
		l.lease.Wait()
	}
}
