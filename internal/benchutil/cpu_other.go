//go:build !linux

package benchutil

import "time"

func threadCPU() (time.Duration, bool) { return 0, false }
