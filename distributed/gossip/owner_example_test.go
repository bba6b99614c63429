package gossip

import (
	"context"
	"fmt"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/throttletest"
)

func ExampleNode_NewOwnedLimiter() {
	clk := throttletest.NewClock()
	net := NewNetwork(clk, 1) // in memory; use ListenUDP in production
	secret := []byte("a shared secret, 16+ bytes long")
	a, _ := NewNode(Config{Transport: net.Endpoint("a"), Secret: secret, Peers: []string{"b"}}, throttle.WithClock(clk))
	b, _ := NewNode(Config{Transport: net.Endpoint("b"), Secret: secret, Peers: []string{"a"}}, throttle.WithClock(clk))
	defer a.Close()
	defer b.Close()
	la, _ := a.NewOwnedLimiter("api", throttle.NewRate(60, time.Minute), 2)
	lb, _ := b.NewOwnedLimiter("api", throttle.NewRate(60, time.Minute), 2)
	clk.Advance(time.Second) // a round: the nodes learn each other's incarnation
	a.Tick()
	b.Tick()
	net.Deliver()
	stop := make(chan struct{})
	defer close(stop)
	go func() { // the network delivers the asks and answers
		for {
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Microsecond):
				net.Deliver()
			}
		}
	}()

	fmt.Println("owner of alice:", la.Owner("alice"), lb.Owner("alice"))
	for _, l := range []*OwnedLimiter{lb, la, lb} {
		d, _ := l.Allow(context.Background(), "alice", 1) // one bucket, on a
		fmt.Println(d.Allowed, d.Remaining)
	}
	fmt.Printf("b forwarded %d, a decided %d locally and %d for b\n", lb.Stats().Forwarded, la.Stats().Local, la.Stats().Served)
	// Output:
	// owner of alice: a a
	// true 1
	// true 0
	// false 0
	// b forwarded 2, a decided 1 locally and 2 for b
}
