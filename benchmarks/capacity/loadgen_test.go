package capacity

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// loadgenEnv makes the test binary a load generator: it connects its
// clients to LOADGEN_ADDR, answers "ready" once each has been answered,
// and then, for each line "run <nanoseconds>" on its standard input, has
// all clients call GetCapacity for that long and prints
// "<calls> <seconds> <Σ last grants> <errors>[ err <first error>]".
const loadgenEnv = "THROTTLE_CAPACITY_LOADGEN"

func loadgenMain() int {
	if err := loadgen(); err != nil {
		fmt.Fprintln(os.Stderr, "load generator:", err)
		return 1
	}
	return 0
}

// genClient is one client: its own connection, as separate client
// processes would have, and its encoded request.
type genClient struct {
	conn  *grpc.ClientConn
	req   []byte
	resp  []byte
	calls int64
	errs  int64
	err   error
	held  float64
}

func (c *genClient) call(ctx context.Context, w wire) error {
	if err := c.conn.Invoke(ctx, w.method, &c.req, &c.resp, grpc.ForceCodec(rawCodec{})); err != nil {
		return err
	}
	g, err := w.granted(c.resp)
	c.held = g
	return err
}

func loadgen() error {
	addr, kind := os.Getenv("LOADGEN_ADDR"), os.Getenv("LOADGEN_WIRE")
	n, err1 := strconv.Atoi(os.Getenv("LOADGEN_CLIENTS"))
	wants, err2 := strconv.ParseFloat(os.Getenv("LOADGEN_WANTS"), 64)
	w, ok := wires[kind]
	if err1 != nil || err2 != nil || !ok {
		return fmt.Errorf("bad environment: %q clients, %q wants, wire %q", os.Getenv("LOADGEN_CLIENTS"), os.Getenv("LOADGEN_WANTS"), kind)
	}
	cs := make([]*genClient, n)
	for i := range cs {
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return err
		}
		defer conn.Close()
		cs[i] = &genClient{conn: conn, req: w.request(fmt.Sprintf("client-%03d", i), "benchmark", wants)}
	}
	// Every client is answered once: the server is up and configured.
	deadline := time.Now().Add(30 * time.Second)
	for _, c := range cs {
		for {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			err := c.call(ctx, w)
			cancel()
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("%s never answered: %w", addr, err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	fmt.Println("ready")
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		var d time.Duration
		if _, err := fmt.Sscanf(in.Text(), "run %d", &d); err != nil {
			return fmt.Errorf("command %q: %w", in.Text(), err)
		}
		fmt.Println(runClients(cs, w, d))
	}
	return in.Err()
}

// runClients has every client call for d, and reports what they did.
func runClients(cs []*genClient, w wire, d time.Duration) string {
	var stop atomic.Bool
	var wg sync.WaitGroup
	for _, c := range cs {
		c.calls, c.errs, c.err = 0, 0, nil
	}
	start := time.Now()
	for _, c := range cs {
		wg.Go(func() {
			ctx := context.Background()
			for !stop.Load() {
				if err := c.call(ctx, w); err != nil {
					c.errs++
					if c.err == nil {
						c.err = err
					}
					continue
				}
				c.calls++
			}
		})
	}
	time.Sleep(d)
	stop.Store(true)
	wg.Wait()
	elapsed := time.Since(start).Seconds()
	var calls, errs int64
	var held float64
	var first error
	for _, c := range cs {
		calls += c.calls
		errs += c.errs
		held += c.held
		if first == nil {
			first = c.err
		}
	}
	line := fmt.Sprintf("%d %g %g %d", calls, elapsed, held, errs)
	if first != nil {
		line += " err " + first.Error()
	}
	return line
}
