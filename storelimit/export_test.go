package storelimit

// Len returns the number of keys m stores, live or not yet swept, for
// the package's external tests.
func (m *Memory) Len() int { return m.size() }
