package rulesetcd_test

import (
	"context"
	"log"
	"time"

	"github.com/throttlekit/throttle/rules"
	"github.com/throttlekit/throttle/rules/rulesetcd"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Rules from an etcd key, followed as it changes, starting from the last
// good document on disk when etcd is down at start-up.
func ExampleNew() {
	client, err := clientv3.New(clientv3.Config{Endpoints: []string{"http://127.0.0.1:2379"}})
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	src := rules.Cached(rulesetcd.New(client, "/config/rules"), "/var/cache/myservice/rules.json")
	ctx := context.Background()
	l, err := rules.OpenSource(ctx, src, 5*time.Second,
		rules.WithErrorFunc(func(err error) {
			log.Print("rules rejected, the previous ones stay: ", err)
		}))
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close()
	go l.Follow(ctx, src, 0)
	// Use l as any throttle.Limiter.
}

// An outage noticed within 2s (a Get every 2s while nothing changes),
// and the watch set up again 500ms after etcd failed it.
func ExampleWithCheckInterval() {
	client, err := clientv3.New(clientv3.Config{Endpoints: []string{"http://127.0.0.1:2379"}})
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	_ = rulesetcd.New(client, "/config/rules",
		rulesetcd.WithCheckInterval(2*time.Second), rulesetcd.WithRetry(500*time.Millisecond))
}
