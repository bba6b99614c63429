//go:build unix

package main

import "syscall"

// openFileLimit returns the process's limit on open files (the Go runtime
// raised the soft limit to the hard one at start), or 0 if unknown.
func openFileLimit() int {
	var l syscall.Rlimit
	if syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l) != nil {
		return 0
	}
	return int(min(l.Cur, 1<<20))
}
