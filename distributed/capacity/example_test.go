package capacity_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"connectrpc.com/connect"

	"github.com/throttlekit/throttle/distributed/capacity"
	capacityv1 "github.com/throttlekit/throttle/distributed/capacity/gen/throttle/capacity/v1"
	"github.com/throttlekit/throttle/throttletest"
)

// Capacity 120 shared by clients wanting 1000, 50 and 10: the small ones
// get what they want, the big one the rest.
func ExampleAllocate() {
	grants := capacity.Allocate(capacity.FairShare, 120, []capacity.Demand{{Wants: 1000}, {Wants: 50}, {Wants: 10}})
	fmt.Println(grants)
	// Output: [60 50 10]
}

func ExampleServer() {
	cfg, err := capacity.ParseConfig([]byte(`{"resources": [
		{"id": "db", "capacity": 120, "algorithm": "fair_share", "lease_length": "60s", "refresh_interval": "15s"},
		{"id": "*", "capacity": 10}]}`))
	if err != nil {
		panic(err)
	}
	clock := throttletest.NewClock()
	s, err := capacity.NewServer(cfg, capacity.WithServerClock(clock), capacity.WithJitter(0))
	if err != nil {
		panic(err)
	}
	// A new server learns what clients hold for one lease length.
	clock.Advance(time.Minute)
	ask := func(client string, wants, has float64) capacity.Grant {
		resp, err := s.GetCapacity(context.Background(), &capacity.Request{
			Client:    client,
			Resources: []capacity.ResourceRequest{{Resource: "db", Wants: wants, Has: has}},
		})
		if err != nil {
			panic(err)
		}
		return resp.Grants[0]
	}
	ask("big", 1000, 0) // alone at first: gets all 120
	ask("mid", 50, 0)   // gets what "big" does not hold: nothing yet
	ask("small", 10, 0)
	ask("big", 1000, 120) // gives back down to its fair share at its refresh
	// "big" may use its old 120 until it confirms the lower lease by
	// refreshing (or the old lease expires): only then do the others get
	// what it gave back.
	ask("big", 1000, 60)
	fmt.Println(ask("mid", 50, 0).Capacity, ask("small", 10, 0).Capacity)
	g := ask("big", 1000, 60)
	fmt.Println(g.Capacity, g.Lease, g.Refresh)
	// Output:
	// 50 10
	// 60 1m0s 15s
}

// A single server needs no election: Solo makes it the master at once.
func ExampleSolo() {
	ctx, cancel := context.WithCancel(context.Background())
	var e capacity.Election = capacity.Solo{}
	err := e.Campaign(ctx, "127.0.0.1:7000", func(l capacity.Leadership) {
		fmt.Printf("master %s, this replica: %v, term %d\n", l.Master, l.IsMaster, l.Term)
		cancel() // stop at once, for the example
	})
	fmt.Println(err)
	// Output:
	// master 127.0.0.1:7000, this replica: true, term 1
	// context canceled
}

// Replicas sharing lease keys: a new master, while it learns, confirms
// what a client says it holds only up to the signed grant it echoes.
func ExampleWithLeaseKeys() {
	cfg := capacity.Config{Resources: []capacity.Template{{ID: "*", Capacity: 100, LeaseLength: time.Minute}}}
	key := []byte("32 random bytes shared by all...") // from a secret store
	clock := throttletest.NewClock()
	replica := func() *capacity.Server {
		s, err := capacity.NewServer(cfg, capacity.WithLeaseKeys(key), capacity.WithServerClock(clock))
		if err != nil {
			panic(err)
		}
		return s
	}
	ask := func(s *capacity.Server, client string, rr capacity.ResourceRequest) capacity.Grant {
		rr.Resource = "db"
		resp, err := s.GetCapacity(context.Background(), &capacity.Request{Client: client, Resources: []capacity.ResourceRequest{rr}})
		if err != nil {
			panic(err)
		}
		return resp.Grants[0]
	}
	old := replica()
	clock.Advance(time.Minute) // past learning
	lease := ask(old, "honest", capacity.ResourceRequest{Wants: 60})

	next := replica() // the master fails over: the next one learns
	fmt.Println(ask(next, "liar", capacity.ResourceRequest{Wants: 100, Has: 100}).Capacity)
	fmt.Println(ask(next, "honest", capacity.ResourceRequest{Wants: 60, Has: 60, Token: lease.Token}).Capacity)
	// Output:
	// 0
	// 60
}

// One bad resource of a request is refused on its own.
func ExampleErrResourceRefused() {
	s, err := capacity.NewServer(capacity.Config{Resources: []capacity.Template{{ID: "*", Capacity: 100}}})
	if err != nil {
		panic(err)
	}
	resp, err := s.GetCapacity(context.Background(), &capacity.Request{Client: "c", Resources: []capacity.ResourceRequest{
		{Resource: "db", Wants: math.NaN()}, {Resource: "cache", Wants: 5},
	}})
	if err != nil {
		panic(err)
	}
	for _, g := range resp.Grants {
		fmt.Println(g.Resource, errors.Is(g.Err, capacity.ErrResourceRefused))
	}
	// Output:
	// db true
	// cache false
}

// WireService's methods take the wire API's generated messages, for a
// gRPC server of one's own; WithIdentity says whom the caller proved to
// be, as Authenticated does for NewHandler.
func ExampleWireService() {
	cfg, err := capacity.ParseConfig([]byte(`{"resources": [{"id": "*", "capacity": 10}]}`))
	if err != nil {
		panic(err)
	}
	svc := capacity.WireService(must(capacity.NewServer(cfg)))
	ctx := capacity.WithIdentity(context.Background(), "alice")
	for _, client := range []string{"alice", "bob"} {
		_, err := svc.GetCapacity(ctx, connect.NewRequest(&capacityv1.GetCapacityRequest{ClientId: client,
			Resources: []*capacityv1.ResourceRequest{{ResourceId: "db", Wants: 5}}}))
		if err != nil {
			fmt.Println(client, connect.CodeOf(err), errors.Is(err, capacity.ErrForbidden))
			continue
		}
		fmt.Println(client, "answered")
	}
	// Output:
	// alice answered
	// bob permission_denied true
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}
