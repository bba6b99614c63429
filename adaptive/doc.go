// Package adaptive protects a service and its dependencies from overload
// without a hand-set limit.
//
//	lim, err := adaptive.New(&adaptive.Gradient2{}, adaptive.Config{Initial: 20})
//	// as any concurrency limit: around a call (or in httplimit, grpclimit)
//	rows, err := throttle.Wrap(lim, "db", query)(ctx)
//
// A Limiter is a concurrency limit that finds itself: the number of
// requests in flight it admits moves with the latency and the failures the
// callers report when they release, the way TCP congestion control moves
// its window. The rule that moves it is an Algorithm: AIMD (loss-based),
// Vegas (queue depth estimated from the no-load RTT) or Gradient2 (the
// long-term RTT against the short-term one, with a tolerance). A Limiter is
// a throttle.Limiter and a throttle.Holder, so it drops into httplimit,
// grpclimit and throttle.Wrap as any concurrency limit does.
//
// A Throttler is the client-side adaptive throttling of the Google SRE
// book ("Handling Overload"): a client drops a request locally with
// probability max(0, (requests − K·accepts) / (requests + 1)) over a
// sliding window, so a backend that rejects most requests is not also
// drowned by the rejections.
//
// Retries with back-off and a shared retry budget are in package retry.
//
// # Hot path
//
// Allow and Release on a Limiter, and Allow and Accept on a Throttler,
// are compare-and-swap loops on packed 64-bit words: no lock, no
// allocation. A Limiter folds the samples of a window into atomic
// counters; the release that closes a window (at least Config.Window
// long, with Config.WindowSamples samples) runs the Algorithm, while
// the others carry on. Only Hold, when it must wait, takes a lock.
package adaptive
