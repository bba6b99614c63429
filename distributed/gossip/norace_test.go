//go:build !race

package gossip

const race = false
