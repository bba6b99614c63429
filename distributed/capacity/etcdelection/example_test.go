package etcdelection_test

import (
	"context"
	"log"
	"os/signal"
	"syscall"
	"time"

	"github.com/throttlekit/throttle/distributed/capacity"
	"github.com/throttlekit/throttle/distributed/capacity/etcdelection"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Each replica of a level campaigns under its own address with the same
// prefix; the others learn the master's address from report.
func Example() {
	client, err := clientv3.New(clientv3.Config{
		Endpoints:   []string{"127.0.0.1:2379"},
		DialTimeout: 5 * time.Second,
	})
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	election, err := etcdelection.New(client, "/throttle/capacity/root", etcdelection.WithTTL(10*time.Second))
	if err != nil {
		log.Fatal(err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	// Campaign resigns (another replica takes over at once) when ctx ends.
	_ = election.Campaign(ctx, "10.0.0.1:7000", func(l capacity.Leadership) {
		switch {
		case l.IsMaster:
			log.Printf("master in term %d: serve, starting in learning mode", l.Term)
		case l.Master != "":
			log.Printf("follower: redirect to %s (term %d)", l.Master, l.Term)
		default:
			log.Print("master unknown: stop granting")
		}
	})
}
