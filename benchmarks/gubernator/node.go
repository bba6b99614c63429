package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	guber "github.com/gubernator-io/gubernator/v2"
	"github.com/sirupsen/logrus"
)

// nodeMain runs one gubernator node, as gubernator's own command does
// (its Daemon: gRPC and HTTP listeners, the V1 service, the peer
// clients), with a static peer list instead of a discovery service. It
// prints "ready" once it answers, and runs until its standard input
// closes.
func nodeMain(args []string) error {
	fs := flag.NewFlagSet("node", flag.ContinueOnError)
	grpcAddr := fs.String("grpc", "", "gRPC listen address")
	httpAddr := fs.String("http", "", "HTTP listen address")
	peers := fs.String("peers", "", "comma-separated gRPC addresses of every node, this one included (default: this one alone)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *grpcAddr == "" || *httpAddr == "" {
		return errors.New("node: -grpc and -http are required")
	}
	log := logrus.New()
	log.SetLevel(logrus.ErrorLevel)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	d, err := guber.SpawnDaemon(ctx, guber.DaemonConfig{
		GRPCListenAddress: *grpcAddr,
		HTTPListenAddress: *httpAddr,
		AdvertiseAddress:  *grpcAddr,
		InstanceID:        *grpcAddr,
		PeerDiscoveryType: "none",
		Logger:            logrus.NewEntry(log),
	})
	if err != nil {
		return err
	}
	defer d.Close()
	list := []string{*grpcAddr}
	if *peers != "" {
		list = strings.Split(*peers, ",")
	}
	var infos []guber.PeerInfo
	for _, p := range list {
		infos = append(infos, guber.PeerInfo{GRPCAddress: p})
	}
	d.SetPeers(infos)
	fmt.Println("ready")
	io.Copy(io.Discard, os.Stdin)
	return nil
}
