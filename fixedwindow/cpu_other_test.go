//go:build !linux

package fixedwindow_test

import "time"

func threadCPU() (time.Duration, bool) { return 0, false }
