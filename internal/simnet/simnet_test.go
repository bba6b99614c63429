package simnet

import (
	"errors"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/throttlekit/throttle/internal/faultsim"
)

// A datagram reaches the receiver's life that listens when it arrives,
// not the one that listened when it was sent; a closed endpoint neither
// sends nor receives.
func TestDeliversToCurrentLife(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		net := faultsim.NewNet(1, 2, time.Millisecond)
		defer net.Close()
		f := New(net, []string{"a", "b"})
		a := f.Endpoint(0)
		var mu sync.Mutex
		got := map[string][]string{}
		listen := func(e *Endpoint, life string) {
			e.Listen(func(p []byte, from string) {
				mu.Lock()
				got[life] = append(got[life], from+":"+string(p))
				mu.Unlock()
			})
		}
		b1 := f.Endpoint(1)
		listen(b1, "b1")
		a.Send("b", []byte("x"))
		a.Send("nowhere", []byte("dropped"))
		b2 := f.Endpoint(1) // b restarts before x arrives
		listen(b2, "b2")
		time.Sleep(5 * time.Millisecond)
		a.Close()
		if err := a.Send("b", []byte("y")); !errors.Is(err, ErrClosed) {
			t.Errorf("send on a closed endpoint: %v", err)
		}
		time.Sleep(5 * time.Millisecond)
		mu.Lock()
		defer mu.Unlock()
		if len(got["b1"]) != 0 || len(got["b2"]) != 1 || got["b2"][0] != "a:x" {
			t.Errorf("deliveries %v, want a:x to b's second life only", got)
		}
	})
}
