// Package envoyrls serves Envoy's global rate-limit API,
// envoy.service.ratelimit.v3.RateLimitService, from the YAML
// configuration of the reference service, envoyproxy/ratelimit, read as
// it is: domains, descriptors with a key and an optional value, nested
// descriptors, wildcard values ('*' anywhere in a value), rate_limit
// (unit, requests_per_unit, name, replaces, unlimited), shadow_mode,
// quota_mode, detailed_metric, value_to_metric and share_threshold, with
// the reference's refusals, each naming its file and line (ConfigError).
//
//	svc, src, err := envoyrls.Open("/etc/ratelimit/config", envoyrls.LoadOptions{}, envoyrls.Options{})
//	g := grpc.NewServer()
//	svc.Register(g)
//	go src.Watch(ctx, 5*time.Second) // hot reload; a bad file keeps the configuration in force
//	http.Handle("/", svc.Handler(nil)) // /json, /healthcheck, /metrics
//
// A request's answer is the reference's, decision by decision, in the
// default fixed-window mode (a side-by-side test compares them): the
// descriptors resolve to rules as the reference resolves them, the
// replaced and unlimited ones are left out, every other one is charged
// its hits (the request's hits_addend, 0 meaning 1, or the descriptor's
// own), and the response holds one status per descriptor and
// OVER_LIMIT when any is over its limit (not in shadow mode).
//
// Beyond the reference, a rule may name another algorithm (token_bucket
// with a burst, sliding_window, sliding_log), and the hits are counted
// by a Backend: Memory (this process), Redis (a server or a Cluster,
// one round trip per request for the fixed windows), or Fleet (the
// daemons of a gossip fleet). Service, the backends and Source are safe
// for concurrent use. cmd/throttled runs a Server from the "envoy"
// section of its configuration; see docs/guide/envoy.md.
package envoyrls
