package storelimit

// Settle waits for the background refills of a leasing Limiter.
func Settle(l *Limiter) {
	if l.lease != nil {
		l.lease.Wait()
	}
}

// MemorySize returns the number of keys m stores, live or not yet swept.
func MemorySize(m *Memory) int { return m.size() }
