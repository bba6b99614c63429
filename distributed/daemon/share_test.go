package daemon_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/throttlekit/throttle/distributed/daemon"
	"github.com/throttlekit/throttle/distributed/daemon/client"
	"github.com/throttlekit/throttle/internal/testproc"
)

// hogEnv makes TestMain hold busy connections instead of running the
// tests: "addr,n" opens n connections to addr, says "ready", and keeps
// each busy with a PING every few milliseconds until its standard input
// closes.
const hogEnv = "THROTTLED_TEST_HOG"

func hog() {
	addr, n, _ := strings.Cut(os.Getenv(hogEnv), ",")
	k, _ := strconv.Atoi(n)
	for range k {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			fmt.Println(err)
			os.Exit(1)
		}
		r := bufio.NewReader(c)
		if _, err := io.WriteString(c, "PING\n"); err != nil {
			os.Exit(1)
		}
		if _, err := r.ReadString('\n'); err != nil {
			os.Exit(1)
		}
		go func() {
			for {
				time.Sleep(3 * time.Millisecond)
				if _, err := io.WriteString(c, "PING\n"); err != nil {
					return
				}
				if _, err := r.ReadString('\n'); err != nil {
					return // reclaimed for another process: the hog keeps the rest
				}
			}
		}()
	}
	fmt.Println("ready")
	io.Copy(io.Discard, os.Stdin)
}

// One local process holding every connection its loopback address may
// have, all busy, must not lock the other local processes out: they share
// 127.0.0.1, and at its cap a process holding fewer connections takes
// the place of one of the biggest holder's (the Go client of that one
// retries on a fresh connection, which is refused while it holds the
// most). Before, the other process got "RF" every time.
func TestLoopbackProcessesShareTheCap(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("processes of loopback TCP peers are found through /proc on Linux only")
	}
	cfg := config("tcp:127.0.0.1:0")
	cfg.Default = daemon.Limit{Rate: "1/m", Burst: 100}
	cfg.MaxConnsPerAddr = 20
	s := start(t, cfg)
	addr := s.Addrs()[0].String()
	cmd := testproc.Self([]string{hogEnv + "=" + addr + ",20"}, "-test.run=^$")
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { stdin.Close(); cmd.Wait() }()
	if line, err := bufio.NewReader(stdout).ReadString('\n'); line != "ready\n" {
		t.Fatalf("hog process: %q, %v", line, err)
	}
	c, err := client.New("tcp", addr, client.WithTimeout(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// A loaded machine may make the look-up of the processes give up
	// (refused, "RF"): the next connection, 50 ms later, looks again.
	for i := 0; ; i++ {
		ok, err := c.Check(context.Background(), "alice")
		if ok && err == nil {
			break
		}
		if i == 4 || !errors.Is(err, client.ErrRefused) {
			t.Fatalf("query %d of another local process, a busy process holding the address's 20 connections: %v, %v", i, ok, err)
		}
		time.Sleep(60 * time.Millisecond)
	}
	for i := range 5 {
		if ok, err := c.Check(context.Background(), "alice"); !ok || err != nil {
			t.Fatalf("query %d on the connection it got: %v, %v", i, ok, err)
		}
	}
	if st := s.Stats(); st.Conns > 20 || st.Reclaimed == 0 {
		t.Errorf("stats %+v: want at most 20 connections from 127.0.0.1, one of the hog's reclaimed", st)
	}
}
