//go:build !unix

package daemon

func fileLimit() uint64 { return 0 }
