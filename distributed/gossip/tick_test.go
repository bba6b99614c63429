package gossip

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/throttlekit/throttle"
)

// Tick called while Start's loop also ticks (as the daemon's tests and
// callers that force a round do): rounds must not run at once, since a
// round takes the limiters' changed keys, which only one round may do.
// Under -race this reported a data race in the change list before rounds
// were serialized.
func TestTickBesideLoop(t *testing.T) {
	udp, err := ListenUDP("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	node, err := NewNode(Config{Transport: udp, Secret: secret, Interval: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer node.Close()
	l, err := node.NewLimiter("api", throttle.PerSecond(1000), 10)
	if err != nil {
		t.Fatal(err)
	}
	if err := node.Start(); err != nil {
		t.Fatal(err)
	}
	stop := time.Now().Add(300 * time.Millisecond)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; time.Now().Before(stop); i++ {
			if _, err := l.Allow(context.Background(), strconv.Itoa(i%512), 1); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	rounds := 0
	for time.Now().Before(stop) {
		if node.Tick() {
			rounds++
		}
	}
	wg.Wait()
	t.Logf("%d rounds run by Tick beside the loop", rounds)
}
