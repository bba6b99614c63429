package storelimit

// Settle waits for the background refills of a leasing Limiter.
func Settle(l *Limiter) {
	if l.lease != nil {
		l.lease.Wait()
	}
}

// MemorySize returns the number of keys m stores, live or not yet swept.
func MemorySize(m *Memory) int { return m.size() }

// SetBatchSlots sets how many calls of l may be at its BatchStore before
// swaps wait to go in batches. Call it before l's first decision.
func SetBatchSlots(l *Limiter, n int) { l.batch.slots = int64(n) }
