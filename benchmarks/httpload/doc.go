// Package httpload holds TestHTTPLoad, a load test on loopback HTTP of the
// adaptive concurrency limits behind httplimit, beside no limiter and a
// fixed limit, driven by wrk (a real load generator, run as a separate
// process). It has no code outside its tests.
//
// The test is opt-in, as it runs for about four minutes:
//
//	THROTTLE_HTTPLOAD=1 go test -run TestHTTPLoad -v -timeout 10m ./httpload
//
// Without THROTTLE_HTTPLOAD=1 it is skipped, saying so. Without wrk in
// PATH it is skipped too, and fails under THROTTLE_REQUIRE_WRK=1.
package httpload
