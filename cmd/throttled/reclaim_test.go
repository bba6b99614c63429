package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/throttlekit/throttle/distributed/daemon/client"
	"github.com/throttlekit/throttle/failsafe"
	"github.com/throttlekit/throttle/internal/testproc"
)

// startCapped starts the daemon with the settings extra and an admin
// listener, and waits until the connections of its start-up check are
// gone, so that the test's connections are the only ones under the caps.
func startCapped(t *testing.T, extra string) *daemonProc {
	t.Helper()
	port, err := testproc.FreePort(0)
	if err != nil {
		t.Fatal(err)
	}
	admin := fmt.Sprintf("127.0.0.1:%d", port)
	d := startDaemon(t, extra+`,"admin":"`+admin+`"`)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		resp, err := http.Get("http://" + admin + "/metrics")
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if strings.Contains(string(b), "\nthrottled_connections 0\n") {
				return d
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the daemon's start-up connections did not go: %v", err)
		}
	}
}

// query sends one query on c and returns the reply, or the error.
func query(c net.Conn, tag string) (string, error) {
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, tag+"\n"); err != nil {
		return "", err
	}
	var b [3]byte
	_, err := io.ReadFull(c, b[:])
	return string(b[:]), err
}

// closedByDaemon reports whether the daemon closed c: a read sees the
// end of the stream (or a reset) rather than a timeout.
func closedByDaemon(c net.Conn) bool {
	c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	var b [1]byte
	_, err := c.Read(b[:])
	var ne net.Error
	return err != nil && !(errors.As(err, &ne) && ne.Timeout())
}

// queryProcess asks the daemon at listen about tag from another process
// (throttled's query mode) and returns its output.
func queryProcess(listen, tag string) (string, error) {
	out, err := throttled("-listen", listen, "-query", tag).CombinedOutput()
	return strings.TrimSpace(string(out)), err
}

// A process holding its cap with idle connections no longer locks out
// the other workers that share the cap (over TCP loopback, every local
// worker): a new connection takes the place of the longest-idle one,
// which the daemon closes. (Every new connection was refused "RF" while
// the idle ones were held.)
func TestIdleConnectionsMakeRoom(t *testing.T) {
	d := startCapped(t, `"max_conns":6,"max_conns_per_addr":4,"idle_budget":"200ms"`)
	hoard := make([]net.Conn, 4)
	for i := range hoard {
		hoard[i] = d.dial(t)
		if r, err := query(hoard[i], "hoard"); r != "OK\n" || err != nil {
			t.Fatalf("connection %d: %q, %v", i, r, err)
		}
		time.Sleep(10 * time.Millisecond) // hoard[0] is the longest idle
	}
	time.Sleep(400 * time.Millisecond) // all idle past the budget
	// Another worker on the same address is answered.
	if out, err := queryProcess("tcp:"+d.tcp, "worker"); out != "worker OK" || err != nil {
		t.Fatalf("another worker, the cap held by idle connections: %q, %v", out, err)
	}
	if !closedByDaemon(hoard[0]) {
		t.Fatal("the longest-idle connection was not the one closed")
	}
	// hoard[1] turns active: the next new connection takes hoard[2]'s
	// place, not hoard[1]'s.
	if r, err := query(hoard[1], "hoard"); r != "OK\n" || err != nil {
		t.Fatalf("hoard[1]: %q, %v", r, err)
	}
	for range 2 { // the first fills the place the query process left
		c := d.dial(t)
		if r, err := query(c, "new"); r != "OK\n" || err != nil {
			t.Fatalf("a new connection at the cap: %q, %v", r, err)
		}
	}
	if !closedByDaemon(hoard[2]) {
		t.Fatal("hoard[2], the longest idle, was not closed")
	}
	if r, err := query(hoard[1], "hoard"); r != "OK\n" || err != nil {
		t.Fatalf("hoard[1], active, was closed: %q, %v", r, err)
	}
	// max_conns (6, over every client): TCP has 4 (hoard[1], hoard[3]
	// and the two new ones), the Unix socket fills the rest, and the
	// connection beyond takes the place of the longest-idle one of any
	// client: hoard[3].
	time.Sleep(400 * time.Millisecond)
	for range 3 {
		u, err := net.Dial("unix", d.unix)
		if err != nil {
			t.Fatal(err)
		}
		defer u.Close()
		if r, err := query(u, "unix"); r != "OK\n" || err != nil {
			t.Fatalf("unix connection: %q, %v", r, err)
		}
	}
	if !closedByDaemon(hoard[3]) {
		t.Fatal("at max_conns, the longest-idle connection (hoard[3]) was not closed")
	}
}

// Connections in use are never closed to make room: at the cap with
// every connection active, new ones are refused "RF", and the active
// ones see every reply.
func TestActiveConnectionsAreNotReclaimed(t *testing.T) {
	d := startCapped(t, `"max_conns_per_addr":4,"idle_budget":"200ms"`)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for range 4 {
		c := d.dial(t)
		if r, err := query(c, "busy"); r != "OK\n" || err != nil {
			t.Fatalf("%q, %v", r, err)
		}
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				case <-time.After(20 * time.Millisecond):
				}
				if r, err := query(c, "busy"); r != "OK\n" || err != nil {
					errs <- errors.Join(err, errors.New("reply "+r))
					return
				}
			}
		})
	}
	deadline := time.Now().Add(1500 * time.Millisecond)
	refused := 0
	for time.Now().Before(deadline) {
		c, err := net.Dial("tcp", d.tcp)
		if err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(10 * time.Second))
		got, _ := io.ReadAll(c)
		c.Close()
		if string(got) != "RF\n" {
			t.Fatalf("a new connection with every one active: %q, want RF", got)
		}
		refused++
		time.Sleep(100 * time.Millisecond)
	}
	close(stop)
	wg.Wait()
	select {
	case err := <-errs:
		t.Fatalf("an active connection was closed: %v", err)
	default:
	}
	if refused < 5 {
		t.Fatalf("only %d attempts", refused)
	}
}

// The Go client does not notice that its pooled connection was closed
// to make room: it retries on a fresh one, and the query is answered.
func TestClientRetriesReclaimedConnection(t *testing.T) {
	d := startCapped(t, `"max_conns_per_addr":2,"idle_budget":"200ms"`)
	cl, err := client.New("tcp", d.tcp, client.WithTimeout(5*time.Second), client.WithPolicy(failsafe.Closed))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if ok, err := cl.Check(context.Background(), "a"); !ok || err != nil {
		t.Fatalf("first query: %v, %v", ok, err)
	}
	other := d.dial(t)
	if r, err := query(other, "b"); r != "OK\n" || err != nil {
		t.Fatalf("%q, %v", r, err)
	}
	time.Sleep(400 * time.Millisecond)
	// A third connection takes the place of the client's pooled one,
	// the longest idle.
	third := d.dial(t)
	if r, err := query(third, "c"); r != "OK\n" || err != nil {
		t.Fatalf("third connection: %q, %v", r, err)
	}
	// The daemon answers a query that reaches the reclaimed connection
	// before it is closed; one that comes after finds it closed, and
	// the client retries. Either way, no failure, and by the second
	// query the client has dialed again.
	for range 2 {
		if ok, err := cl.Check(context.Background(), "a"); !ok || err != nil {
			t.Fatalf("query after the pooled connection was reclaimed: %v, %v", ok, err)
		}
		time.Sleep(300 * time.Millisecond)
	}
	if st := cl.Stats(); st.Failures != 0 || st.Dials != 2 {
		t.Fatalf("client stats %+v: want no failure and a second dial", st)
	}
}
