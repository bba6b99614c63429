package redislimit

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/internal/redistest"
	"github.com/throttlekit/throttle/internal/testproc"
)

// burstLoad is what a process of TestExactAcrossProcesses runs: Workers
// goroutines, each with a connection of its own, asking a bucket of
// Burst (refilling once a minute) for one unit of one key until denied.
type burstLoad struct {
	Addr, Prefix      string
	Workers, Burst    int
	Start             int64 // the instant (Unix ns) the goroutines start together
	Admitted, Errored int64
	Err               string
}

// burstChildEnv carries a burstLoad, as JSON, to a process that runs it.
const burstChildEnv = "REDISLIMIT_BURST_LOAD"

// run runs the load and records what its clients saw.
func (b *burstLoad) run() error {
	c := redis.NewClient(&redis.Options{Addr: b.Addr, ContextTimeoutEnabled: true, PoolSize: b.Workers})
	defer c.Close()
	l, err := NewTokenBucket(c, throttle.NewRate(1, time.Minute), b.Burst, WithPrefix(b.Prefix), WithTimeout(5*time.Second))
	if err != nil {
		return err
	}
	var admitted, errored atomic.Int64
	var wg sync.WaitGroup
	time.Sleep(time.Until(time.Unix(0, b.Start)))
	for range b.Workers {
		wg.Go(func() {
			for {
				d, err := l.Allow(context.Background(), "k", 1)
				if err != nil {
					errored.Add(1)
					return
				}
				if !d.Allowed {
					return
				}
				admitted.Add(1)
			}
		})
	}
	wg.Wait()
	b.Admitted, b.Errored = admitted.Load(), errored.Load()
	return nil
}

// burstChild runs the burstLoad of its environment, if any, prints what
// it saw as JSON, and reports whether this process was such a child.
func burstChild() bool {
	spec := os.Getenv(burstChildEnv)
	if spec == "" {
		return false
	}
	var b burstLoad
	err := json.Unmarshal([]byte(spec), &b)
	if err == nil {
		err = b.run()
	}
	if err != nil {
		b.Err = err.Error()
	}
	out, _ := json.Marshal(b)
	fmt.Println(string(out))
	return true
}

// TestExactAcrossProcesses: 6 processes × 16 goroutines, each process
// with its own client and connections, starting together, drain one key
// of a bucket of 3000 on Redis's clock (refilling one unit a minute, so
// none during the test): exactly 3000 units are admitted in all, counted
// by the clients, and no call fails.
func TestExactAcrossProcesses(t *testing.T) {
	srv := redistest.Start(t)
	spec, err := json.Marshal(burstLoad{Addr: srv.Addr, Prefix: uniquePrefix(), Workers: 16, Burst: 3000,
		Start: time.Now().Add(time.Second).UnixNano()})
	if err != nil {
		t.Fatal(err)
	}
	loads := make([]burstLoad, 6)
	var wg sync.WaitGroup
	for i := range loads {
		wg.Go(func() {
			out, err := testproc.Self([]string{burstChildEnv + "=" + string(spec)}, "-test.run=^$").Output()
			if err == nil {
				err = json.Unmarshal([]byte(strings.Split(strings.TrimSpace(string(out)), "\n")[0]), &loads[i])
			}
			if err != nil {
				loads[i].Err = fmt.Sprintf("process %d: %v: %s", i, err, out)
			}
		})
	}
	wg.Wait()
	var admitted int64
	per := make([]int64, len(loads))
	for i, l := range loads {
		per[i] = l.Admitted
		if l.Err != "" || l.Errored > 0 {
			t.Fatalf("a process failed: %s (%d calls failed)", l.Err, l.Errored)
		}
		admitted += l.Admitted
	}
	t.Logf("admitted per process: %v", per)
	if admitted != 3000 {
		t.Fatalf("6 processes admitted %d in all, want exactly 3000", admitted)
	}
}
