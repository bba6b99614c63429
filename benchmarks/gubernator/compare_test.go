package main

import (
	"bytes"
	"flag"
	"os"
	"strings"
	"testing"
)

var compare = flag.Bool("compare", false, "run the comparison's smoke test: builds cmd/throttled and starts servers on loopback")

// TestMain lets the test binary play the roles the comparison starts it
// in: a gubernator node, the load generator.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && (os.Args[1] == "node" || os.Args[1] == "load") {
		main()
		return
	}
	os.Exit(m.Run())
}

// A short run of the whole comparison: both subjects answer, every
// table is written.
//
//	cd benchmarks/gubernator && GOWORK=off go test -v -args -compare
func TestSmoke(t *testing.T) {
	if !*compare {
		t.Skip("the comparison builds cmd/throttled and starts servers on loopback: run it with -args -compare (GOWORK=off, in benchmarks/gubernator)")
	}
	var out bytes.Buffer
	err := compareMain([]string{"-rounds", "1", "-duration", "300ms", "-conns", "1,4", "-batch", "4", "-accuracy", "1s"}, &out)
	t.Log(out.String())
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"| 4 | 4 | throttled |", "| 4 | 4 | gubernator |", "| throttled | ", "| gubernator | "} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("report lacks %q", want)
		}
	}
}
