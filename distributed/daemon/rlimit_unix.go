//go:build unix

package daemon

import "syscall"

// fileLimit returns the soft limit on open files (the Go runtime raises
// it to the hard limit at start where allowed), or 0 if unknown.
func fileLimit() uint64 {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return 0
	}
	if lim.Cur < lim.Max {
		// Raise the soft limit where allowed (the runtime does this at
		// start too; a library user may have lowered it since).
		want := lim
		want.Cur = lim.Max
		if syscall.Setrlimit(syscall.RLIMIT_NOFILE, &want) == nil {
			lim = want
		}
	}
	return uint64(lim.Cur)
}
