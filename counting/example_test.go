package counting_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/counting"
	"github.com/throttlekit/throttle/httplimit"
	"github.com/throttlekit/throttle/tokenbucket"
)

// At most 2 requests in flight per user: a third is refused until one
// finishes.
func Example() {
	l, err := counting.New(2)
	if err != nil {
		panic(err)
	}
	defer l.Close()
	ctx := context.Background()
	for range 3 {
		d, _ := l.Allow(ctx, "alice", 1)
		fmt.Println("allowed:", d.Allowed, "in flight:", l.InFlight("alice"))
	}
	_ = l.Release("alice", 1) // one request done
	d, _ := l.Allow(ctx, "alice", 1)
	fmt.Println("allowed:", d.Allowed, "in flight:", l.InFlight("alice"))
	// Output:
	// allowed: true in flight: 1
	// allowed: true in flight: 2
	// allowed: false in flight: 2
	// allowed: true in flight: 2
}

// Hold waits its turn; the release function is safe to defer and to
// call early.
func ExampleSemaphore_Hold() {
	sem, err := counting.NewSemaphore(10)
	if err != nil {
		panic(err)
	}
	release, err := sem.Hold(context.Background(), "", 4)
	if err != nil {
		panic(err)
	}
	defer release()
	fmt.Println("in flight:", sem.InFlight())
	release()
	fmt.Println("in flight:", sem.InFlight())
	// Output:
	// in flight: 4
	// in flight: 0
}

// A global cap in front of per-client limits: at most 2 requests in
// flight in all, whatever the client, then 10 a second per client. The
// Semaphore ignores the key, so every request shares it; a request it
// refuses never spends from the per-client limit behind it, and its slot
// is held until the handler returns.
func ExampleSemaphore_global() {
	global, err := counting.NewSemaphore(2)
	if err != nil {
		panic(err)
	}
	perClient, err := tokenbucket.New(throttle.PerSecond(10), 20)
	if err != nil {
		panic(err)
	}
	defer perClient.Close()
	capAll, err := httplimit.New(global, httplimit.WithName("global"))
	if err != nil {
		panic(err)
	}
	limitEach, err := httplimit.New(perClient, httplimit.WithName("per-client"))
	if err != nil {
		panic(err)
	}
	inHandler, finish := make(chan struct{}), make(chan struct{})
	slow := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		inHandler <- struct{}{}
		<-finish
	})
	h := capAll(limitEach(slow))
	serve := func(client string) int {
		r := httptest.NewRequest("GET", "/report", nil)
		r.RemoteAddr = client + ":1234"
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w.Code
	}

	var running sync.WaitGroup
	for _, client := range []string{"192.0.2.1", "192.0.2.2"} {
		running.Go(func() { serve(client) })
		<-inHandler // both slots are taken
	}
	fmt.Println("a third client while two are served:", serve("192.0.2.3"))
	close(finish)
	running.Wait()
	fmt.Println("in flight after they finish:", global.InFlight())
	go func() { <-inHandler }()
	fmt.Println("the third client again:", serve("192.0.2.3"))
	// Output:
	// a third client while two are served: 429
	// in flight after they finish: 0
	// the third client again: 200
}
