// Command leases shows capacity leases end to end on loopback: a server
// shares 120 queries per second of a database among three clients that
// want 1000, 50 and 10, over the JSON protocol of the wire API. After the
// server's learning period the small clients get what they want and the
// big one the rest: 60, 50, 10.
//
//	go run ./examples/leases
package main

import (
	"context"
	"fmt"
	"log"
	"net"
	"net/http"
	"time"

	"connectrpc.com/connect"

	"github.com/throttlekit/throttle/distributed/capacity"
)

const config = `{"resources": [
	{"id": "db.queries", "capacity": 120, "algorithm": "fair_share",
	 "lease_length": "3s", "refresh_interval": "1s"},
	{"id": "*", "capacity": 0}]}`

func main() {
	cfg, err := capacity.ParseConfig([]byte(config))
	if err != nil {
		log.Fatal(err)
	}
	server, err := capacity.NewServer(cfg)
	if err != nil {
		log.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	var protocols http.Protocols
	protocols.SetHTTP1(true)
	protocols.SetUnencryptedHTTP2(true) // for gRPC without TLS
	srv := &http.Server{Handler: capacity.NewHandler(server), Protocols: &protocols, ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(ln)
	defer srv.Shutdown(context.Background())
	fmt.Println("serving the capacity API on", ln.Addr())

	transport := capacity.NewHTTPTransport(nil, connect.WithProtoJSON())
	var resources []*capacity.RateResource
	for _, c := range []struct {
		name  string
		wants float64
	}{{"big", 1000}, {"mid", 50}, {"small", 10}} {
		client, err := capacity.NewClient(transport, []string{ln.Addr().String()}, capacity.WithClientID(c.name))
		if err != nil {
			log.Fatal(err)
		}
		defer client.Close()
		r, err := client.Rate("db.queries", c.wants)
		if err != nil {
			log.Fatal(err)
		}
		resources = append(resources, r)
	}
	fmt.Printf("%-12s %8s %8s %8s\n", "time", "big", "mid", "small")
	for range 6 {
		time.Sleep(time.Second)
		fmt.Printf("%-12s", time.Now().Format("15:04:05"))
		for _, r := range resources {
			fmt.Printf(" %6.1f/s", r.Capacity())
		}
		fmt.Println()
	}
	// Each resource is a throttle.Limiter upholding its lease locally.
	d, err := resources[2].Allow(context.Background(), "", 1)
	fmt.Println("small client may send a query now:", d.Allowed, err)
}
