package httplimit_test

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/httplimit"
	"github.com/throttlekit/throttle/tokenbucket"
)

// Calls to an upstream that allows one request every 20 ms (per host, the
// Transport's default key) wait their turn, spaced out; to one that allows
// a request an hour, failing fast, the second call is refused without
// reaching it.
func ExampleTransport() {
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "ok")
	}))
	defer upstream.Close()

	perHost, err := tokenbucket.New(throttle.NewRate(1, 20*time.Millisecond), 1)
	if err != nil {
		panic(err)
	}
	defer perHost.Close()
	paced := &http.Client{Transport: &httplimit.Transport{
		Limiter:     perHost,
		Wait:        true,
		WaitOptions: []throttle.WaitOption{throttle.MaxWait(time.Second)},
	}}
	start := time.Now()
	for range 3 {
		resp, err := paced.Get(upstream.URL)
		if err != nil {
			panic(err)
		}
		resp.Body.Close()
		fmt.Println(resp.StatusCode)
	}
	fmt.Println("spaced out:", time.Since(start) >= 40*time.Millisecond)

	hourly, err := tokenbucket.New(throttle.NewRate(1, time.Hour), 1)
	if err != nil {
		panic(err)
	}
	defer hourly.Close()
	failFast := &http.Client{Transport: &httplimit.Transport{Limiter: hourly}}
	for range 2 {
		resp, err := failFast.Get(upstream.URL)
		if errors.Is(err, throttle.ErrLimited) {
			fmt.Println("limited")
			continue
		}
		if err != nil {
			panic(err)
		}
		resp.Body.Close()
		fmt.Println(resp.StatusCode)
	}
	paced.CloseIdleConnections()
	failFast.CloseIdleConnections()
	// Output:
	// 200
	// 200
	// 200
	// spaced out: true
	// 200
	// limited
}
