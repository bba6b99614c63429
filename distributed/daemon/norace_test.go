//go:build !race

package daemon_test

const race = false
