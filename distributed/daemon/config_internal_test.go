package daemon

import "testing"

// The default max_conns_per_addr keeps what one client can pin under half
// the host's TCP memory-pressure threshold. (It was max_conns less a
// sixteenth: 61,440 connections of ~300 KB, 1.7 GB, from one address.)
func TestDefaultPerAddrBoundedByMemory(t *testing.T) {
	for _, c := range []struct {
		maxConns          int
		pressure, perConn uint64
		want              int
	}{
		{65536, 0, 300 << 10, 61440},            // unknown pressure: by descriptors
		{65536, 1_572_311_040, 300 << 10, 2559}, // this host's tcp_mem at 300 KB each
		{100, 1_572_311_040, 300 << 10, 94},     // few descriptors
		{65536, 1 << 20, 300 << 10, 1},          // at least one
	} {
		if got := defaultPerAddr(c.maxConns, c.pressure, c.perConn); got != c.want {
			t.Errorf("defaultPerAddr(%d, %d, %d) = %d, want %d", c.maxConns, c.pressure, c.perConn, got, c.want)
		}
	}
	if p := tcpMemPressure(); p > 0 {
		cfg := Config{Listen: []string{"127.0.0.1:1"}, Default: Limit{Rate: "1/s", Burst: 1}}.WithDefaults()
		if err := cfg.Validate(); err != nil {
			t.Fatal(err)
		}
		if pin := uint64(cfg.MaxConnsPerAddr) * connMemory(); pin > p/2 && cfg.MaxConnsPerAddr > 1 {
			t.Fatalf("default max_conns_per_addr %d lets one client pin %d bytes, above half of tcp_mem's pressure threshold %d",
				cfg.MaxConnsPerAddr, pin, p)
		}
	}
}
