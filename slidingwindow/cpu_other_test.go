//go:build !linux

package slidingwindow_test

import "time"

func threadCPU() (time.Duration, bool) { return 0, false }
