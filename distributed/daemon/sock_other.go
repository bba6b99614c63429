//go:build !linux

package daemon

import (
	"net"
	"time"
)

func peerCred(net.Conn) string     { return "" }
func unsent(net.Conn) (int, bool)  { return 0, false }
func tcpMemPressure() uint64       { return 0 }
func tcpRmemDefault() uint64       { return 0 }
func pending(net.Conn) (int, bool) { return 0, false }

// peerPIDs finds no process: the caps stay per address.
func peerPIDs(conns []net.Conn, _ []int, _ bool, _ time.Time) []int { return make([]int, len(conns)) }
